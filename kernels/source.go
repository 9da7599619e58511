package kernels

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"sort"
)

// sources are the kernel implementations compiled into this binary; their
// hash goes into every record so that results name the kernels they timed.
//
//go:embed bf16.go expert.go gemm.go permute.go router.go
var sources embed.FS

// SourceHash is the sha256 of the kernel sources (file names and contents,
// in name order), hex encoded.
func SourceHash() string {
	names, _ := fs.Glob(sources, "*")
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		b, _ := sources.ReadFile(n) // embedded: cannot fail
		h.Write([]byte(n))
		h.Write([]byte{0})
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))
}
