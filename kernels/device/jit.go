package device

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/kernels"
)

// CUDAKernels lists the CUDA C sources (kernels/cuda/*.cu, embedded) and the
// -D constants each one takes; every one includes moebench.cuh. Their
// semantics are the host functions of this package; they are compiled by
// NVRTC at run time for the device's architecture with the shape baked in.
//
// Not yet proven on a GPU: CI compiles them (sm_80, sm_90), audits their
// machine code (sass_test.go: no spills, registers that fit the launch,
// 16-byte accesses, REDUX) and runs them on the CPU (internal/hostsim: the
// same sources, CUDA's threads and warp intrinsics simulated) against the
// host functions, but no kernel has been launched on a GPU in this build.
var CUDAKernels = map[string][]string{
	"router.cu":     {"MB_EXPERTS", "MB_TOPK", "MB_SIGMOID", "MB_PRE_SOFTMAX", "MB_GROUPS", "MB_GROUP_TOPK", "MB_SCALE"},
	"permute.cu":    {"MB_HIDDEN"},
	"swiglu.cu":     {"MB_FFN"},
	"unpermute.cu":  {"MB_HIDDEN", "MB_TOPK"},
	"sortchunks.cu": {"MB_HIDDEN", "MB_EP", "MB_LOCAL"},
	"commtest.cu":   {"MB_CT_CHANNELS", "MB_CT_SLOTS"},
	"copy.cu":       {},
	"gradadd.cu":    {},
	"fp8.cu":        {},
	"deepep.cu": {"MB_HIDDEN", "MB_TOPK", "MB_RANKS", "MB_LOCAL", "MB_TOKENS", "MB_CHANNELS", "MB_DRING", "MB_DCHUNK", "MB_CRING", "MB_CCHUNK",
		"MB_WARPS", "MB_MINB", "MB_DE_BUG", "MB_Q_ECNT", "MB_Q_FLAGS", "MB_Q_GO", "MB_Q_DMETA", "MB_Q_CMETA", "MB_Q_RINGS",
		"MB_F_PER_RANK", "MB_F_PER_EXPERT", "MB_F_CHAN_END", "MB_F_SRC_END", "MB_F_RECV_CHAN", "MB_F_SEND_HEAD"},
	"fifotest.cu": {"MB_FT_HIDDEN", "MB_FT_STAGES", "MB_FT_WARPS", "MB_NO_BULK"},
	"hybridep.cu": {"MB_HE_EP", "MB_HE_DOMAIN", "MB_HE_TOKENS", "MB_HE_EXPERTS", "MB_HE_TOPK", "MB_HE_HIDDEN",
		"MB_HE_DHIDDEN", "MB_HE_CHUNK", "MB_HE_STAGES", "MB_NO_BULK"},
}

// CUDAOptional are the constants a kernel source takes only when given
// (each under #ifdef, with its default in the source); Compile passes them
// on where the caller sets them.
var CUDAOptional = map[string][]string{
	"hybridep.cu": {"MB_HE_PSTAGES"}, // the permute's ring, fewer stages where shared memory is short
	// deepep: the forward dispatch's rows at fp8 (packed e4m3 rows with
	// their scales); the 16-byte receivers where the bulk path would compile
	"deepep.cu": {"MB_DE_DHIDDEN", "MB_NO_BULK"},
}

const CUDAHeader = "moebench.cuh"

// Compiler turns a CUDA C source into an image for cuModuleLoadData:
// NVRTC (*cuda.NVRTC) on a GPU; the tests also compile the kernels for the
// CPU (internal/hostsim) to run them on the fake driver.
type Compiler interface {
	Compile(name, source string, headers map[string]string, options []string) ([]byte, error)
	ID() string // the compiler and its version, part of the cache key
	// GPU says whether its images run on a GPU (NVRTC) rather than on the
	// host's CPUs (a simulation); a wrapper passes its compiler's answer on.
	GPU() bool
}

// NewCompiler opens the compiler the cuda device uses: NVRTC. Tests that
// run the device on the fake driver replace it.
var NewCompiler = func() (Compiler, error) { return cuda.OpenNVRTC() }

// JIT compiles the embedded kernels and caches the images on disk, keyed by
// the source, the header, the options, the architecture and the compiler's
// ID.
type JIT struct {
	Compiler Compiler
	CacheDir string // "" disables the cache
	Hits     int    // compilations answered from the cache
	Compiled int    // compilations the compiler ran
}

// Compile returns the image of kernel file for arch (e.g. "sm_90" for a
// cubin, "compute_90" for PTX the driver compiles at load) with the
// constants in defines; only those the kernel takes are used, and all of them
// must be given (CUDAKernels) but the optional ones (CUDAOptional).
func (j *JIT) Compile(file, arch string, defines map[string]string) ([]byte, error) {
	names, ok := CUDAKernels[file]
	if !ok {
		return nil, fmt.Errorf("unknown kernel source %q", file)
	}
	src, err := kernels.Sources.ReadFile("cuda/" + file)
	if err != nil {
		return nil, err
	}
	used := map[string]string{}
	for _, n := range names {
		v, ok := defines[n]
		if !ok {
			return nil, fmt.Errorf("kernel %s needs -D%s", file, n)
		}
		used[n] = v
	}
	for _, n := range CUDAOptional[file] {
		if v, ok := defines[n]; ok {
			used[n] = v
		}
	}
	return j.CompileSource(file, string(src), arch, used)
}

// CompileSource compiles src (named file; it may include moebench.cuh)
// for arch with every constant of defines, through the cache as Compile.
func (j *JIT) CompileSource(file, src, arch string, defines map[string]string) ([]byte, error) {
	hdr, err := kernels.Sources.ReadFile("cuda/" + CUDAHeader)
	if err != nil {
		return nil, err
	}
	opts := []string{"--gpu-architecture=" + arch, "-std=c++17"}
	names := make([]string, 0, len(defines))
	for n := range defines {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		opts = append(opts, "-D"+n+"="+defines[n])
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00%s\x00%s", file, src, hdr, strings.Join(opts, " "), j.Compiler.ID())
	key := hex.EncodeToString(h.Sum(nil))
	path := ""
	if j.CacheDir != "" {
		path = filepath.Join(j.CacheDir, key+".cubin")
		if b, err := os.ReadFile(path); err == nil && validImage(b, arch) {
			j.Hits++
			return b, nil
		}
	}
	cubin, err := j.Compiler.Compile(file, src, map[string]string{CUDAHeader: string(hdr)}, opts)
	if err != nil {
		return nil, err
	}
	j.Compiled++
	if path != "" { // best effort: a cache that cannot be written only costs time
		if err := os.MkdirAll(j.CacheDir, 0o755); err == nil {
			tmp, err := os.CreateTemp(j.CacheDir, key+".tmp-")
			if err == nil {
				_, werr := tmp.Write(cubin)
				cerr := tmp.Close()
				if werr == nil && cerr == nil {
					os.Rename(tmp.Name(), path)
				} else {
					os.Remove(tmp.Name())
				}
			}
		}
	}
	return cubin, nil
}

// validImage: b is a whole image for arch, as the cache wrote it (a cubin
// is an ELF file; PTX text ends with its NUL).
func validImage(b []byte, arch string) bool {
	if strings.HasPrefix(arch, "compute_") {
		return len(b) > 1 && b[len(b)-1] == 0
	}
	return len(b) > 4 && string(b[:4]) == "\x7fELF"
}
