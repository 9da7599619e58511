package harness

import (
	"slices"
	"testing"

	"github.com/moebench/moebench/harness/layer"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/internal/hostsim"
	"github.com/moebench/moebench/kernels/device"
)

// BenchmarkStepIssue is the host's cost of issuing one step of the cuda
// device's layer — every kernel launch, GEMM, copy, event record and wait
// moebench queues, through the driver's and cuBLASLt's entry points — the
// number that says whether a step is host-bound. It runs on the fake driver
// (two fake GPUs) with the kernels' and GEMMs' work skipped
// (FAKECUDA_SKIP_KERNELS, FAKECUBLASLT_SKIP), so that what is left is host
// time: permute_order runs in the warm-up steps only, for the counts
// alltoall's exchange reads (the routing is fixed), and the host's wait
// for them is not counted (it is HostWait's). Reported
// as host-µs/step (the median step's issue time) besides ns/op (a whole
// step, the fake's waits included) and allocs/op (the Go heap allocations
// of a step, which do not depend on the machine's load). The fake's own
// per-call costs (a lock and a wake-up of the stream's thread per queued
// call) are in the time: it is an upper bound of moebench's. Its
// subbenchmarks are the default preset at EP 8; the same issued as CUDA
// graphs (--cuda-graph, fixed routing: each part captured once, launched
// every step — on the fake driver, whose launch replays every captured call
// on the host, so this says nothing of a real driver's graph launch); and
// a real layer's shape at EP 8 (the tokens cut to 256 per rank: the issue
// cost does not depend on them).
//
//	go test -run '^$' -bench StepIssue -benchtime 200x ./harness
func BenchmarkStepIssue(b *testing.B) {
	comp := hostsim.Setup(b)
	old := device.NewCompiler
	device.NewCompiler = func() (device.Compiler, error) { return comp, nil }
	b.Cleanup(func() { device.NewCompiler = old })
	b.Setenv("FAKECUDA_SKIP_KERNELS", "router_topk,permute_rows,gather_f32,sort_chunks,swiglu_prob,unpermute_sum")
	b.Setenv("FAKECUBLASLT_SKIP", "1")
	tiny := setup.DefaultConfig()
	qwen := setup.DefaultConfig()
	p, _ := setup.LookupPreset("qwen3-30b-a3b")
	qwen.Preset, qwen.Shape = p.Name, p.Shape
	qwen.Tokens = 256
	graph := tiny
	graph.CUDAGraph = true
	for _, c := range []struct {
		name string
		cfg  setup.Config
	}{{"tiny-ep8", tiny}, {"tiny-ep8-cuda-graph", graph}, {"qwen3-30b-a3b-ep8", qwen}} {
		b.Run(c.name, func(b *testing.B) {
			cfg := c.cfg
			cfg.Device, cfg.EP, cfg.Check, cfg.RoutingFixed = "cuda", 8, false, true
			gs, err := device.OpenGPUs(0, 2, b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			devs := make([]device.Device, len(gs))
			for i, g := range gs {
				devs[i] = g
			}
			defer layer.CloseDevices(devs)
			dl := deviceRun(b, cfg, devs...)
			defer dl.Dispatcher.Close()
			for range 3 { // plans, modules and buffers made; the counts computed
				if err := dl.Step(); err != nil {
					b.Fatal(err)
				}
			}
			b.Setenv("FAKECUDA_SKIP_KERNELS", "*")
			if cfg.CUDAGraph { // captured once each (the routing is fixed), replayed every step
				if dl.Graph, err = layer.NewCUDAGraphs(dl); err != nil {
					b.Fatal(err)
				}
				defer dl.Graph.Free()
			}
			issue := make([]float64, 0, b.N)
			b.ReportAllocs() // the Go heap allocations of a step's issue: deterministic, unlike its time on a shared machine
			b.ResetTimer()
			for range b.N {
				if err := dl.Step(); err != nil {
					b.Fatal(err)
				}
				issue = append(issue, dl.IssueMS)
			}
			b.StopTimer()
			slices.Sort(issue)
			b.ReportMetric(1e3*issue[len(issue)/2], "host-µs/step")
		})
	}
}
