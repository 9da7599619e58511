package device

import (
	"fmt"
	"unsafe"
)

// MappedHost is page-locked host memory mapped into the devices' address
// space: kernels read and write it at Dev, the host at Host.
type MappedHost struct {
	Dev   Addr
	Host  unsafe.Pointer
	Bytes int64
}

// Int32At is the int32 at byte offset off.
func (m MappedHost) Int32At(off int64) *int32 {
	if off < 0 || off+4 > m.Bytes {
		panic(fmt.Sprintf("mapped memory: offset %d of %d bytes", off, m.Bytes))
	}
	return (*int32)(unsafe.Add(m.Host, off))
}
