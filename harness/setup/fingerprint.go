package setup

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/results"
)

// envPrefixes name the environment variables recorded in the stack because
// they can change results.
var envPrefixes = []string{"MOEBENCH_", "CUDA_", "NCCL_", "NVSHMEM_", "NVIDIA_", "GOMAXPROCS", "GODEBUG", "GOGC"}

// Fingerprint describes the stack a run uses: the host machine always, and
// on the cuda device the GPUs, driver and libraries too.
func Fingerprint(device, note, version string) results.Stack {
	host, _ := os.Hostname()
	s := results.Stack{Device: device, Note: note, Hostname: host,
		CPU: cpuModel(), CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), MemoryBytes: memTotal(),
		OS: runtime.GOOS + "/" + runtime.GOARCH + " " + kernelRelease(), GoVersion: runtime.Version(),
		Version: version, KernelHash: kernels.SourceHash(), Commit: BuildCommit()}
	if device == "cuda" {
		if g, err := cuda.ReadGPUInfo(); err != nil {
			s.Note = strings.TrimPrefix(s.Note+"; ", "; ") + "GPU fingerprint unread: " + err.Error()
		} else {
			s.GPU = &results.GPUStack{Model: g.Model, Count: g.Count, SMs: g.SMs, CopyEngines: g.CopyEngines,
				MemoryBytes: g.MemoryBytes, Driver: g.Driver, CUDADriver: g.CUDADriver, NVRTC: g.NVRTC, CuBLASLt: g.CuBLASLt,
				NCCL: g.NCCL, NCCLEP: g.NCCLEP, SMClockMHz: g.SMClockMHz, MemClockMHz: g.MemClockMHz, PowerLimitW: g.PowerLimitW,
				Topology: g.Topology, Unread: g.Unread}
		}
	}
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		for _, p := range envPrefixes {
			if strings.HasPrefix(k, p) {
				if s.Env == nil {
					s.Env = map[string]string{}
				}
				s.Env[k] = v
			}
		}
	}
	return s
}

// BuildCommit is the VCS revision moebench was built from, "+dirty" when the
// build had uncommitted changes: from Go's build information (go build
// stamps it), else — go run and go test do not — from the git checkout
// holding the working directory when that checkout is moebench's own
// module (what go run compiled); "" when neither says.
func BuildCommit() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		var rev string
		dirty := false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if rev != "" && dirty {
			rev += "+dirty"
		}
		if rev != "" {
			return rev
		}
	}
	return checkoutCommit()
}

// checkoutCommit is the HEAD of the git checkout around the working
// directory, "+dirty" with uncommitted changes to tracked files, when its
// go.mod is moebench's module; "" otherwise (no git, not a checkout, or
// another module).
func checkoutCommit() string {
	git := func(args ...string) (string, bool) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, "git", args...).Output()
		return strings.TrimSpace(string(out)), err == nil
	}
	top, ok := git("rev-parse", "--show-toplevel")
	if !ok {
		return ""
	}
	mod, err := os.ReadFile(filepath.Join(top, "go.mod"))
	if err != nil || !strings.HasPrefix(string(mod), "module "+modulePath+"\n") {
		return ""
	}
	rev, ok := git("-C", top, "rev-parse", "HEAD")
	if !ok {
		return ""
	}
	if st, ok := git("-C", top, "status", "--porcelain", "--untracked-files=no"); ok && st != "" {
		rev += "+dirty"
	}
	return rev
}

// modulePath is moebench's Go module.
const modulePath = "github.com/moebench/moebench"

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

func kernelRelease() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "unknown kernel"
	}
	return strings.TrimSpace(string(b))
}

// memTotal is MemTotal from /proc/meminfo in bytes, 0 if unknown.
func memTotal() int64 {
	v, ok := meminfo("MemTotal:")
	if !ok {
		return 0
	}
	return int64(v)
}

// meminfo reads one /proc/meminfo field in bytes.
func meminfo(field string) (float64, bool) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 64)
			return kb * 1024, err == nil
		}
	}
	return 0, false
}
