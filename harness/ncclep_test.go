package harness

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/harness/layer"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/internal/hostsim"
	"github.com/moebench/moebench/results"
)

// TestNCCLEPLayerOnHostSim: the whole layer with --impl library — NCCL EP's
// high-throughput mode for hybridep, its low-latency mode for deepep-ll —
// through the fake libnccl_ep on the fake driver's two GPUs (one rank
// each, every rank's calls from its GPU's thread), passes the check
// against the float64 reference; the record says which design, library
// and version ran, how it spent SMs, and each library phase's host-call
// time beside its event time. The high-throughput mode runs a training
// step — its backward through the library's pass_direction BWD dispatch
// and combine — whose every gradient passes the gradient check; the
// low-latency mode, which has no backward, times the forward alone and
// says why.
func TestNCCLEPLayerOnHostSim(t *testing.T) {
	harnesstest.UseHostSimLayer(t)
	harnesstest.UseFakeNCCLEP(t)
	t.Setenv("NCCL_EP_SHUFFLE_SMS", "3")
	for _, c := range []struct {
		dispatcher, design, timeoutMS string
		phases, calls                 []string
		detail                        []string
		train                         bool
	}{
		{"hybridep", "HybridEP's design via NCCL EP", "", []string{"shared", "router", "update", "dispatch", "experts", "combine",
			"combine-bwd", "experts-bwd", "dispatch-bwd", "router-bwd", "shared-bwd"}, []string{"update", "dispatch", "combine", "combine-bwd", "dispatch-bwd"},
			[]string{"waits bounded by timeout_ns = --ncclep-timeout 5s", "backward: ncclEpDispatch and ncclEpCombine with pass_direction BWD over the forward's handle"}, true},
		{"deepep-ll", "DeepEP low-latency design via NCCL EP", "60000", []string{"shared", "router", "dispatch", "experts", "combine"}, []string{"dispatch", "combine"},
			[]string{"waits bounded by NCCL_EP_TIMEOUT_MS=60000, which overrides --ncclep-timeout 5s", "forward only: NCCL EP's low-latency mode has no backward pass"}, false},
	} {
		t.Run(c.dispatcher, func(t *testing.T) {
			t.Setenv("NCCL_EP_TIMEOUT_MS", c.timeoutMS)
			cfg := harnesstest.DeviceCases()["softmax-natural"]
			cfg.Dispatcher, cfg.Impl, cfg.EP, cfg.Hidden = c.dispatcher, dispatchers.ImplLibrary, 2, 128 // the low-latency combine takes 128-multiples
			rec, err := Run(cfg, setup.Env{Version: "test"})
			if err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed {
				t.Fatalf("%v; %+v", err, rec)
			}
			var names []string
			for _, p := range rec.Timing.Phases {
				names = append(names, p.Name)
				if lib := slices.Contains(c.calls, p.Name); lib != (p.HostCall != nil) {
					t.Errorf("phase %s: host call %+v", p.Name, p.HostCall)
				}
			}
			if !slices.Equal(names, c.phases) {
				t.Errorf("phases %v, want %v", names, c.phases)
			}
			lib := rec.Library
			if lib == nil || !strings.HasPrefix(lib.Design, c.design) || lib.Name != "NCCL EP" || lib.Version != "0.1.0" ||
				!strings.Contains(lib.Detail, "over NCCL 2.30.7") || !strings.Contains(rec.Ranks.Note, "NCCL EP 0.1.0") ||
				!strings.Contains(rec.SMs.Note, "max_num_sms AUTO") || !strings.Contains(rec.SMs.Note, "NCCL_EP_SHUFFLE_SMS=3") {
				t.Errorf("library %+v; ranks %q; sms %+v", lib, rec.Ranks.Note, rec.SMs)
			}
			for _, w := range c.detail {
				if lib != nil && !strings.Contains(lib.Detail, w) {
					t.Errorf("library detail %q: want %q in it", lib.Detail, w)
				}
			}
			if g := rec.Correctness.Grads; c.train {
				// every gradient (input, probability → router, experts' fc1 and fc2, shared) checked against the reference
				if rec.Config.Pass != results.PassTraining || rec.Config.PassNote != "" || rec.Timing.Backward == nil || g == nil || len(g.PerTensor) < 5 ||
					!(g.MaxRelErr <= g.Tolerance) || rec.Traffic.CombineBackwardLogical != rec.Traffic.CombineLogical ||
					rec.Traffic.DispatchBackwardLogical != rec.Traffic.DispatchLogical || !strings.Contains(rec.Traffic.BackwardFormula, "pass_direction BWD") {
					t.Errorf("pass %q, note %q, gradients %+v, traffic %+v", rec.Config.Pass, rec.Config.PassNote, g, rec.Traffic)
				} else {
					t.Logf("gradients: %v", g.PerTensor)
				}
			} else if rec.Config.Pass != results.PassForward || !strings.HasPrefix(rec.Config.PassNote, "NCCL EP's") || g != nil { // never a training step's label on the forward alone; the mode's own reason
				t.Errorf("pass %q, note %q", rec.Config.Pass, rec.Config.PassNote)
			}
			var table strings.Builder
			if err := results.WriteTable(&table, rec); err != nil || !strings.Contains(table.String(), "# library: "+c.design) ||
				!strings.Contains(table.String(), "# host call              dispatch p50") {
				t.Errorf("table: %v\n%s", err, table.String())
			}
			t.Logf("max rel err %.2e\n%s", rec.Correctness.MaxRelErr, table.String())
		})
	}
}

// TestNCCLEPUnavailable: NCCL EP's gate says why it cannot run, with the
// precise reason, for each of its needs: the library (and its API), NCCL's
// Device API, a CUDA 13 driver, its run-time compile's nvcc and headers,
// an sm_90 GPU, one GPU per rank, at most 8 ranks per node, and the
// modes' shape limits; none of them runs a step.
func TestNCCLEPUnavailable(t *testing.T) {
	harnesstest.UseHostSimLayer(t)
	harnesstest.UseFakeNCCLEP(t)
	nccl := os.Getenv("MOEBENCH_NCCL")
	for _, c := range []struct {
		name, dispatcher string
		env              map[string]string
		cfg              func(*setup.Config)
		want             []string
	}{
		{"no-library", "hybridep", map[string]string{"MOEBENCH_NCCL_EP": "/nonexistent/libnccl_ep.so.0"}, nil,
			[]string{"NCCL EP cannot run here: MOEBENCH_NCCL_EP=/nonexistent/libnccl_ep.so.0 does not load"}},
		{"another-api", "hybridep", map[string]string{"MOEBENCH_NCCL_EP": nccl}, nil, // a library without NCCL EP's entry points
			[]string{"symbol ncclEpGetVersion missing", "not the API moebench speaks"}},
		{"no-nccl", "deepep-ll", map[string]string{"MOEBENCH_NCCL": "/nonexistent/libnccl.so.2"}, nil,
			[]string{"NCCL EP loads over NCCL, which is missing: MOEBENCH_NCCL=/nonexistent/libnccl.so.2 does not load"}},
		{"nccl-without-device-api", "hybridep", map[string]string{"FAKENCCL_VERSION": "22803"}, nil,
			[]string{"NCCL 2.28.3 has no Device API (NCCL EP needs 2.29 or later"}},
		{"cuda-12-driver", "deepep-ll", map[string]string{"FAKECUDA_DRIVER_VERSION": "12080"}, nil,
			[]string{"the CUDA driver supports CUDA 12.8, and NCCL EP needs CUDA 13"}},
		{"no-nvcc", "hybridep", map[string]string{"NCCL_EP_JIT_NVCC": "/nonexistent/nvcc"}, nil,
			[]string{"its run-time compile needs nvcc (/nonexistent/nvcc"}},
		{"no-headers", "deepep-ll", map[string]string{"NCCL_HOME": t.TempDir()}, nil,
			[]string{"its run-time compile needs NCCL's device headers (NCCL_EP_JIT_BUILD_INCLUDE_DIR or NCCL_HOME): no nccl_device.h in"}},
		{"sm80", "hybridep", map[string]string{"FAKECUDA_CC": "80"}, nil, []string{"GPU 0 is sm_80 and NCCL EP needs sm_90 or later", "GPU 1 is sm_80"}},
		{"packed-and-too-many", "hybridep", nil, func(c *setup.Config) { c.EP, c.Experts = 16, 32 },
			[]string{"ranks 0 and 1 share GPU 0: NCCL EP needs one GPU per rank", "ranks 8 and 9 share GPU 1", "16 ranks on one node: NCCL EP supports at most 8 per node"}},
		{"tokens", "hybridep", nil, func(c *setup.Config) { c.Tokens = 8200 },
			[]string{"NCCL EP's high-throughput mode cannot take this layer: 8200 tokens per rank, above its 8192"}},
		{"hidden", "deepep-ll", nil, func(c *setup.Config) { c.Hidden = 64 },
			[]string{"NCCL EP's low-latency mode cannot take this layer: hidden 64: its low-latency combine needs a multiple of 128"}},
		{"sms", "deepep-ll", nil, func(c *setup.Config) { c.SMs, c.Experts = 3, 64 },
			[]string{"--sms 3: 64 experts need at least 5 SMs"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			cfg := harnesstest.DeviceCases()["softmax-natural"]
			cfg.Dispatcher, cfg.Impl, cfg.EP, cfg.Hidden, cfg.Iters, cfg.Warmup = c.dispatcher, dispatchers.ImplLibrary, 2, 128, 1, 0
			if c.cfg != nil {
				c.cfg(&cfg)
			}
			rec, err := Run(cfg, setup.Env{Version: "test"})
			if !dispatchers.IsUnavailable(err) || rec.Status != results.StatusUnavailable || rec.Timing != nil {
				t.Fatalf("want unavailable: %v; %+v", err, rec)
			}
			for _, w := range c.want {
				if !strings.Contains(rec.Reason, w) {
					t.Errorf("reason %q: want %q in it", rec.Reason, w)
				}
			}
		})
	}
}

// TestNCCLEPFailures: a library call that fails is reported with its call,
// NCCL's result and the rank; a rank that does not take part in a
// collective makes the others' kernels give up after --ncclep-timeout (the
// group's timeout_ns; --comm-timeout, moebench's own waits, stays 5s),
// and the run fails naming the rank and the call after which its GPU
// failed, instead of hanging — in one process and on the path of a
// communicator that spans processes (FAKENCCL_NET: every byte through the
// fake NCCL's send/recv).
func TestNCCLEPFailures(t *testing.T) {
	for _, net := range []string{"", "1"} {
		t.Run(map[string]string{"": "one-process", "1": "across-processes"}[net], func(t *testing.T) {
			if net != "" {
				hostsim.SkipIfShort(t, "one-process")
			}
			harnesstest.UseHostSimLayer(t) // fresh fakes: a GPU the last run failed stays failed in its fake driver
			harnesstest.UseFakeNCCLEP(t)
			t.Setenv("FAKENCCL_NET", net)
			ncclepFailures(t)
		})
	}
}

func ncclepFailures(t *testing.T) {
	for _, c := range []struct {
		name, dispatcher, hook, value string
		want                          []string
	}{
		{"failing-call", "hybridep", "FAKENCCLEP_FAIL", "ncclEpCombine",
			[]string{"combine on rank 0: ncclEpCombine: ncclInternalError (3, internal error", "combine on rank 1: ncclEpCombine: ncclInternalError"}},
		{"rank-missing", "deepep-ll", "FAKENCCLEP_SKIP", "ncclEpDispatch 1",
			[]string{"experts: host wait: rank 0: the GPU failed after NCCL EP's ncclEpDispatch (a collective that waits past --ncclep-timeout 300ms traps its kernels): cuStreamSynchronize: CUDA_ERROR_LAUNCH_FAILED"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv(c.hook, c.value)
			cfg := harnesstest.DeviceCases()["softmax-natural"]
			cfg.Dispatcher, cfg.Impl, cfg.EP, cfg.Hidden, cfg.NCCLEPTimeout = c.dispatcher, dispatchers.ImplLibrary, 2, 128, 300*time.Millisecond
			var rec *results.Record
			var err error
			hostsim.Within(t, time.Minute, func() { rec, err = Run(cfg, setup.Env{Version: "test"}) })
			if err == nil || rec.Status != results.StatusFailed {
				t.Fatalf("want a failure: %v; %+v", err, rec)
			}
			for _, w := range c.want {
				if !strings.Contains(rec.Reason, w) {
					t.Errorf("reason %q: want %q in it", rec.Reason, w)
				}
			}
		})
	}
}

// TestNCCLEPFP8OnHostSim: --precision fp8 with --impl library — NCCL EP's
// high-throughput mode (hybridep, a training step) and its low-latency
// mode (deepep-ll) — dispatches e4m3 rows and their 1×128 scales through
// the fake libnccl_ep's NCCL_EP_DISP_QUANT_FWD recipe and passes the check
// (the reference on the same quantized inputs: a slot given another row's
// scales fails it); the record says fp8, the recipe and the fp8 row bytes.
// At hidden 384 (scale rows of 12 B) it is unavailable with the header's
// reason.
func TestNCCLEPFP8OnHostSim(t *testing.T) {
	harnesstest.UseHostSimLayer(t)
	harnesstest.UseFakeNCCLEP(t)
	for _, c := range []struct {
		dispatcher string
		train      bool
	}{{"hybridep", true}, {"deepep-ll", false}} {
		t.Run(c.dispatcher, func(t *testing.T) {
			cfg := harnesstest.DeviceCases()["softmax-natural"]
			cfg.Dispatcher, cfg.Impl, cfg.EP, cfg.Hidden, cfg.Precision = c.dispatcher, dispatchers.ImplLibrary, 2, 512, setup.PrecisionFP8
			rec, err := Run(cfg, setup.Env{Version: "test"})
			if err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed {
				t.Fatalf("%v; %s %q %+v", err, rec.Status, rec.Reason, rec.Correctness)
			}
			if c.train && (rec.Correctness.Grads == nil || !(rec.Correctness.Grads.MaxRelErr <= rec.Correctness.Grads.Tolerance)) {
				t.Errorf("gradients %+v", rec.Correctness.Grads)
			}
			if rec.Config.Precision != setup.PrecisionFP8 || !strings.HasPrefix(rec.GEMM.Method, layer.ExpertPathFP8Dev+"; ") || rec.GEMM.FP8Path != "cublaslt-fp8-block" ||
				rec.Library == nil || !strings.Contains(rec.Library.Detail, "quant_recipe NCCL_EP_DISP_QUANT_FWD") {
				t.Errorf("precision %q, expert path %q, library %+v", rec.Config.Precision, rec.GEMM.Method, rec.Library)
			}
			tr, w := rec.Traffic, int64(0)
			if c.train {
				w = 4 // the routing weight
			}
			row := int64(512 + 512/128*4) // e4m3 values and fp32 scales
			algo := row                   // DeepEP's convention; its low-latency test counts 16 B of metadata a selection at fp8
			if c.dispatcher == "deepep-ll" {
				algo += 16
			}
			if copies := tr.CombineLogical / (2 * 512); tr.DispatchLogical != copies*(row+w) || tr.DispatchAlgorithm != copies*algo || !strings.Contains(tr.Formula, "e4m3") {
				t.Errorf("traffic %+v (copies %d, fp8 row %d B)", tr, copies, row)
			}
			t.Logf("max rel err %.2e", rec.Correctness.MaxRelErr)
		})
	}
	cfg := harnesstest.DeviceCases()["softmax-natural"]
	cfg.Dispatcher, cfg.Impl, cfg.EP, cfg.Hidden, cfg.Precision = "hybridep", dispatchers.ImplLibrary, 2, 384, setup.PrecisionFP8
	rec, err := Run(cfg, setup.Env{Version: "test"})
	if !dispatchers.IsUnavailable(err) || rec.Status != results.StatusUnavailable || !strings.Contains(rec.Reason, "hidden must be a multiple of 512") {
		t.Errorf("hidden 384: %v, %s %q", err, rec.Status, rec.Reason)
	}
}
