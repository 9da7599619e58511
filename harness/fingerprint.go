package harness

import (
	"bufio"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"

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
		Version: version, KernelHash: kernels.SourceHash(), Commit: commit()}
	if device == "cuda" {
		if g, err := cuda.ReadGPUInfo(); err != nil {
			s.Note = strings.TrimPrefix(s.Note+"; ", "; ") + "GPU fingerprint unread: " + err.Error()
		} else {
			s.GPU = &results.GPUStack{Model: g.Model, Count: g.Count, SMs: g.SMs, CopyEngines: g.CopyEngines,
				MemoryBytes: g.MemoryBytes, Driver: g.Driver, CUDADriver: g.CUDADriver, NVRTC: g.NVRTC, CuBLASLt: g.CuBLASLt,
				NCCL: g.NCCL, SMClockMHz: g.SMClockMHz, MemClockMHz: g.MemClockMHz, PowerLimitW: g.PowerLimitW,
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

// commit is the VCS revision the binary was built from, if Go recorded it.
func commit() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
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
	return rev
}

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
