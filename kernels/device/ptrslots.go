package device

import (
	"unsafe"

	"github.com/moebench/moebench/internal/cuda"
)

// The grouped GEMM reads its operands' addresses from a device array. The
// arrays live in a fixed set of slots, each a device array with a
// page-locked host copy it is uploaded from asynchronously, so that a call
// whose groups changed (routing drawn per step moves every expert's rows)
// neither allocates nor waits for its stream, and the set never grows: a
// slot is reused, least recently filled first, once its last call has run
// (an event recorded after it; the host waits only when the GPU runs
// ptrSlotCount calls behind).

// PtrSlotCount is how many pointer arrays the device keeps.
const PtrSlotCount = 64

// ptrSlot is one pointer array: its content (the key), device and pinned
// host memory of bytes, and the event recorded after its last use.
type ptrSlot struct {
	key   string
	dev   Addr
	host  MappedHost
	bytes int64
	used  Event
}

// ptrArray is the device address of an array holding ptrs, uploaded on s
// into a slot unless one holds it already; done must be called with the
// slot's index once the call that reads it is queued.
func (c *CUDA) ptrArray(ptrs []uint64, s Stream) (Addr, int, error) {
	b, err := HostBytes(ptrs)
	if err != nil {
		return 0, 0, err
	}
	if i, ok := c.PtrIndex[string(b)]; ok {
		return c.PtrSlots[i].dev, i, nil
	}
	if len(c.PtrSlots) < PtrSlotCount {
		c.PtrSlots = append(c.PtrSlots, ptrSlot{})
	}
	i := c.ptrNext % len(c.PtrSlots)
	c.ptrNext++
	sl := &c.PtrSlots[i]
	if sl.used != nil { // its last call may still read it
		if err := c.Drv.SyncEvent(sl.used); err != nil {
			return 0, 0, err
		}
	} else if sl.used, err = c.NewEvent(); err != nil {
		return 0, 0, err
	}
	delete(c.PtrIndex, sl.key)
	if n := int64(len(b)); n > sl.bytes { // a first use, or more groups than before
		if sl.bytes > 0 {
			Free(c, &sl.dev)
			c.FreeMapped(sl.host)
		}
		sl.bytes = max(n, 8*3*64) // room for 64 groups
		if sl.dev, err = c.Alloc(sl.bytes); err != nil {
			sl.bytes = 0
			return 0, 0, err
		}
		if sl.host, err = c.AllocMapped(sl.bytes); err != nil {
			sl.bytes = 0
			return 0, 0, err
		}
	}
	copy(unsafe.Slice((*byte)(sl.host.Host), len(b)), b)
	if err := cuda.CopyToDevice(c.Drv, sl.dev, unsafe.Slice((*byte)(sl.host.Host), len(b)), s); err != nil {
		return 0, 0, err
	}
	sl.key = string(b)
	c.PtrIndex[sl.key] = i
	return sl.dev, i, nil
}

// ptrDone records that slot i's array is read by the work queued on s so
// far.
func (c *CUDA) ptrDone(i int, s Stream) error { return c.Drv.Record(c.PtrSlots[i].used, s) }

// freePtrSlots frees the slots' memory (the device idle).
func (c *CUDA) freePtrSlots() {
	for i := range c.PtrSlots {
		if c.PtrSlots[i].bytes > 0 {
			c.FreeMapped(c.PtrSlots[i].host)
		}
	}
}
