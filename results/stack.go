package results

import (
	"fmt"
	"sort"
	"strings"
)

// identity lists the stack fields that make numbers comparable: the device,
// the hardware, the drivers and libraries, the Go toolchain and the
// environment variables recorded. The host name, the note, the moebench
// version, commit and kernel hash are left out: identical nodes compare, and
// comparing two builds on one stack is what regression checks are for.
func (s Stack) identity() [][2]string {
	id := [][2]string{{"device", s.Device}, {"cpu", s.CPU}, {"cpus", fmt.Sprint(s.CPUs)},
		{"gomaxprocs", fmt.Sprint(s.GOMAXPROCS)}, {"memory_bytes", fmt.Sprint(s.MemoryBytes)},
		{"os", s.OS}, {"go_version", s.GoVersion}}
	if g := s.GPU; g != nil {
		id = append(id, [][2]string{{"gpu.model", g.Model}, {"gpu.count", fmt.Sprint(g.Count)},
			{"gpu.sms", fmt.Sprint(g.SMs)}, {"gpu.copy_engines", fmt.Sprint(g.CopyEngines)},
			{"gpu.memory_bytes", fmt.Sprint(g.MemoryBytes)}, {"gpu.driver", g.Driver},
			{"gpu.cuda_driver", fmt.Sprint(g.CUDADriver)}, {"gpu.nvrtc", g.NVRTC}, {"gpu.cublaslt", g.CuBLASLt},
			{"gpu.nccl", g.NCCL}, {"gpu.sm_clock_mhz", fmt.Sprint(g.SMClockMHz)},
			{"gpu.mem_clock_mhz", fmt.Sprint(g.MemClockMHz)}, {"gpu.power_limit_w", fmt.Sprint(g.PowerLimitW)},
			{"gpu.topology", g.Topology}}...)
	} else {
		id = append(id, [2]string{"gpu", "none"})
	}
	keys := make([]string, 0, len(s.Env))
	for k := range s.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		id = append(id, [2]string{"env." + k, s.Env[k]})
	}
	return id
}

// StackKey is a string equal for two stacks exactly when they are the same
// stack (see identity).
func (s Stack) StackKey() string {
	var b strings.Builder
	for _, kv := range s.identity() {
		fmt.Fprintf(&b, "%s=%s;", kv[0], kv[1])
	}
	return b.String()
}

// StackDiff lists what differs between two stacks, one "field: a → b" per
// line; empty when they are the same stack.
func StackDiff(a, b Stack) []string {
	av, bv := map[string]string{}, map[string]string{}
	var names []string
	for _, kv := range a.identity() {
		av[kv[0]] = kv[1]
		names = append(names, kv[0])
	}
	for _, kv := range b.identity() {
		if _, ok := av[kv[0]]; !ok {
			names = append(names, kv[0])
		}
		bv[kv[0]] = kv[1]
	}
	var out []string
	for _, n := range names {
		x, okx := av[n]
		y, oky := bv[n]
		if x != y || okx != oky {
			out = append(out, fmt.Sprintf("%s: %s → %s", n, orAbsent(x, okx), orAbsent(y, oky)))
		}
	}
	return out
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

// Workload is what a point runs: layer shape, routing, seed, EP and device.
// Records of one workload on one stack are compared with each other.
func (c Config) Workload() string {
	w := fmt.Sprintf("%s tokens=%d hidden=%d ffn=%d experts=%d topk=%d shared=%d score=%s groups=%d/%d scale=%g routing=%s seed=%d ep=%d device=%s",
		c.Preset, c.Tokens, c.Hidden, c.FFN, c.Experts, c.TopK, c.SharedExperts, c.Score, c.Groups, c.GroupTopK,
		c.TopKScale, c.Routing, c.Seed, c.EP, c.Device)
	if c.RoutingPerStep {
		w += " per-step"
	}
	if c.Domain > 0 {
		w += fmt.Sprintf(" domain=%d", c.Domain)
	}
	if c.GPUs > 0 {
		w += fmt.Sprintf(" gpus=%d", c.GPUs)
	}
	return w
}

// Settings is what is varied within a workload: the dispatcher, its
// implementation and its SM budget.
func (c Config) Settings() string {
	s := fmt.Sprintf("%s/%s sms=%d", c.Dispatcher, c.Impl, c.SMs)
	if c.FeplbBase != "" {
		s += fmt.Sprintf(" base=%s dynamic=%d", c.FeplbBase, c.FeplbDynamic)
	}
	if c.FeplbPolicy != "" {
		s += " policy=" + c.FeplbPolicy
	}
	return s
}
