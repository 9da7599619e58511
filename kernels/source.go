package kernels

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"sort"
)

// Sources are the kernel implementations in this binary — the host ones and
// the CUDA C ones; their hash goes into every record so that results name the
// kernels they timed.
//
//go:embed bf16.go expert.go fp8.go gemm.go permute.go router.go cuda/*.cu cuda/*.cuh
var Sources embed.FS

// SourceHash is the sha256 of the kernel sources (file names and contents,
// in name order), hex encoded.
func SourceHash() string {
	var names []string
	fs.WalkDir(Sources, ".", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			names = append(names, p)
		}
		return nil
	})
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		b, _ := Sources.ReadFile(n) // embedded: cannot fail
		h.Write([]byte(n))
		h.Write([]byte{0})
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))
}
