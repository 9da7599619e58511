package results

import (
	"fmt"
	"math"
	"sort"
	"strings"
)

// A stack field either changes results (a difference makes two records
// incomparable) or does not (a difference is only noted). Fields that change
// results: the device, CPU model and count, GOMAXPROCS, the OS and kernel
// version (major.minor), the Go toolchain, the GPU model, count, SMs, copy
// engines, driver, library versions, clocks, power limit and topology, and
// the recorded environment variables that steer a run. Fields that do not:
// memory sizes within memorySlack of each other (the kernel's and the
// driver's reservations move by kilobytes between boots), the kernel's patch
// level and build suffix, where moebench's own files live (MOEBENCH_CACHE,
// the nightly script's variables), and — not part of the identity at all —
// the host name, the note, the moebench version, commit and kernel hash:
// identical nodes compare, and comparing two builds on one stack is what
// regression checks are for.

// memorySlack is the relative difference of two memory sizes that still
// counts as the same memory.
const memorySlack = 0.02

// harmlessEnv are recorded environment variables that say where files are,
// not how a run behaves.
var harmlessEnv = map[string]bool{"MOEBENCH_CACHE": true, "MOEBENCH_NIGHTLY_DIR": true, "MOEBENCH_BIN": true,
	"MOEBENCH_COMPARE_ARGS": true, "MOEBENCH_NIGHTLY_ADVISE": true, "MOEBENCH_DEBUG": true,
	"MOEBENCH_RANK": true, "MOEBENCH_LOCAL_RANK": true, "MOEBENCH_NODE": true, // a process's place in a run over several (the config has the run's size)
	"MOEBENCH_NIGHTLY_PRECISION": true} // nightly.sh's --precision: the records' config.precision says what ran

// field is one stack field: its name, value and, for a field that does not
// change results when only some detail differs, the part that does (same
// reports whether two values are the same for results).
type field struct {
	name, value string
	same        func(a, b string) bool // nil: equal strings
}

// identity lists the stack's fields (see above).
func (s Stack) identity() []field {
	id := []field{{"device", s.Device, nil}, {"cpu", s.CPU, nil}, {"cpus", fmt.Sprint(s.CPUs), nil},
		{"gomaxprocs", fmt.Sprint(s.GOMAXPROCS), nil}, {"memory_bytes", fmt.Sprint(s.MemoryBytes), sameMemory},
		{"os", s.OS, sameKernel}, {"go_version", s.GoVersion, nil}}
	if g := s.GPU; g != nil {
		id = append(id, []field{{"gpu.model", g.Model, nil}, {"gpu.count", fmt.Sprint(g.Count), nil},
			{"gpu.sms", fmt.Sprint(g.SMs), nil}, {"gpu.copy_engines", fmt.Sprint(g.CopyEngines), nil},
			{"gpu.memory_bytes", fmt.Sprint(g.MemoryBytes), sameMemory}, {"gpu.driver", g.Driver, nil},
			{"gpu.cuda_driver", fmt.Sprint(g.CUDADriver), nil}, {"gpu.nvrtc", g.NVRTC, nil}, {"gpu.cublaslt", g.CuBLASLt, nil},
			{"gpu.nccl", g.NCCL, nil}, {"gpu.nccl_ep", g.NCCLEP, nil}, {"gpu.sm_clock_mhz", fmt.Sprint(g.SMClockMHz), nil},
			{"gpu.mem_clock_mhz", fmt.Sprint(g.MemClockMHz), nil}, {"gpu.power_limit_w", fmt.Sprint(g.PowerLimitW), nil},
			{"gpu.topology", g.Topology, nil}}...)
	} else {
		id = append(id, field{"gpu", "none", nil})
	}
	keys := make([]string, 0, len(s.Env))
	for k := range s.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		id = append(id, field{"env." + k, s.Env[k], nil})
	}
	return id
}

// sameMemory: sizes within memorySlack of each other.
func sameMemory(a, b string) bool {
	var x, y float64
	if _, err := fmt.Sscan(a, &x); err != nil {
		return false
	}
	if _, err := fmt.Sscan(b, &y); err != nil {
		return false
	}
	return math.Abs(x-y) <= memorySlack*math.Max(x, y)
}

// sameKernel: the same OS and architecture, and the same kernel major.minor
// ("linux/amd64 6.18.44-fc-v657" and "linux/amd64 6.18.51-fc-v769" are).
func sameKernel(a, b string) bool { return kernelSeries(a) == kernelSeries(b) }

func kernelSeries(os string) string {
	plat, rel, _ := strings.Cut(os, " ")
	parts := strings.SplitN(rel, ".", 3)
	if len(parts) < 2 {
		return os
	}
	return plat + " " + parts[0] + "." + strings.TrimRightFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' })
}

// StackKey is a string equal for two stacks exactly when every field is
// equal, harmless ones included (reports group by it).
func (s Stack) StackKey() string {
	var b strings.Builder
	for _, f := range s.identity() {
		fmt.Fprintf(&b, "%s=%s;", f.name, f.value)
	}
	return b.String()
}

// StackDiff lists what differs between two stacks, one "field: a → b" per
// line: relevant differences, which make their records incomparable, and
// harmless ones (see identity), which are only worth a note. Both are empty
// for the same stack.
func StackDiff(a, b Stack) (relevant, harmless []string) {
	av, bv := map[string]field{}, map[string]field{}
	var names []string
	for _, f := range a.identity() {
		av[f.name] = f
		names = append(names, f.name)
	}
	for _, f := range b.identity() {
		if _, ok := av[f.name]; !ok {
			names = append(names, f.name)
		}
		bv[f.name] = f
	}
	for _, n := range names {
		x, okx := av[n]
		y, oky := bv[n]
		if okx == oky && x.value == y.value {
			continue
		}
		line := fmt.Sprintf("%s: %s → %s", n, orAbsent(x.value, okx), orAbsent(y.value, oky))
		env, isEnv := strings.CutPrefix(n, "env.")
		if isEnv && harmlessEnv[env] || okx && oky && x.same != nil && x.same(x.value, y.value) {
			harmless = append(harmless, line)
		} else {
			relevant = append(relevant, line)
		}
	}
	return relevant, harmless
}

func orAbsent(v string, ok bool) string {
	if !ok {
		return "(absent)"
	}
	if v == "" {
		return `""`
	}
	return v
}

// Summary is a one-line description of the stack.
func (s Stack) Summary() string {
	if g := s.GPU; g != nil {
		return fmt.Sprintf("%d× %s (%d SMs), driver %s, CUDA %d.%d", g.Count, g.Model, g.SMs, g.Driver, g.CUDADriver/1000, g.CUDADriver%1000/10)
	}
	return fmt.Sprintf("host: %s, %d CPUs (GOMAXPROCS %d), %s, %s", s.CPU, s.CPUs, s.GOMAXPROCS, s.OS, s.GoVersion)
}

// Workload is what a point runs: layer shape, routing, seed, EP, device
// and pass (forward, or forward and backward). Records of one workload on
// one stack are compared with each other.
func (c Config) Workload() string {
	w := fmt.Sprintf("%s tokens=%d hidden=%d ffn=%d experts=%d topk=%d shared=%d score=%s groups=%d/%d scale=%g routing=%s seed=%d ep=%d device=%s pass=%s",
		c.Preset, c.Tokens, c.Hidden, c.FFN, c.Experts, c.TopK, c.SharedExperts, c.ScoreName(), c.Groups, c.GroupTopK,
		c.TopKScale, c.Routing, c.Seed, c.EP, c.Device, c.PassName())
	if c.RoutingPerStep {
		w += " per-step"
	}
	if c.Domain > 0 {
		w += fmt.Sprintf(" domain=%d", c.Domain)
	}
	if c.GPUs > 0 {
		w += fmt.Sprintf(" gpus=%d", c.GPUs)
	}
	if c.HostExperts != "" { // how the host held the experts: "drawn" times drawing them too
		w += " host-experts=" + c.HostExperts
	}
	return w
}

// ScoreName is the router's score function, "pre-softmax" for a softmax
// over all experts before the top-k.
func (c Config) ScoreName() string {
	if c.PreSoftmax {
		return "pre-softmax"
	}
	return c.Score
}

// Settings is what is varied within a workload: the dispatcher, its
// implementation, its SM budget, whether the steps were issued as CUDA
// graphs, and the precision (compare refuses files whose precisions
// differ: PrecisionDiff).
func (c Config) Settings() string {
	s := fmt.Sprintf("%s/%s sms=%d", c.Dispatcher, c.Impl, c.SMs)
	if c.FeplbBase != "" {
		s += fmt.Sprintf(" base=%s dynamic=%d", c.FeplbBase, c.FeplbDynamic)
	}
	if c.FeplbPolicy != "" {
		s += " policy=" + c.FeplbPolicy
	}
	if c.PreprocessSMs != 0 || c.PermuteSMs != 0 {
		s += fmt.Sprintf(" preprocess-sms=%d permute-sms=%d", c.PreprocessSMs, c.PermuteSMs)
	}
	if c.CUDAGraph {
		s += " cuda-graph"
	}
	if c.Precision != "" { // bf16 points keep their older spelling
		s += " precision=" + c.Precision
	}
	if c.Overlap != "" || c.DelayWgrad { // overlap is part of the configuration compared
		s += " overlap=" + c.Overlap
		if c.DelayWgrad {
			s += " delay-wgrad"
		}
	}
	if c.AttentionMS > 0 {
		s += fmt.Sprintf(" attention-ms=%g", c.AttentionMS)
	}
	return s
}
