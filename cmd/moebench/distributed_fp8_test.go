package main

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/moebench/moebench/harness/layer"
	"github.com/moebench/moebench/internal/hostsim"
	"github.com/moebench/moebench/results"
)

// TestDistributedFP8: --precision fp8 over two processes (EP 4, each
// process driving two fake GPUs, NCCL's communicator over every rank)
// for each design that runs across processes: alltoall through NCCL,
// hybridep natively (a domain a process: the inter-domain path's packed
// rows over NCCL) and hybridep through NCCL EP (QUANT_FWD over its
// communicator). Every process exits 0 and rank 0 alone writes one
// record: fp8, a training step whose outputs and gradients pass the check
// (each process its own ranks'), the quantize phase timed on every rank,
// fp8 dispatch bytes. At hidden 384, where hybridep's fp8 is unavailable
// (HybridEP's hidden % 512), both processes refuse with the reason before
// they meet in NCCL, and rank 0 records it.
func TestDistributedFP8(t *testing.T) {
	hostsim.SkipIfShort(t, "the harness's TestFP8CUDALayerOnHostSim, TestFP8AlltoallLibraryOnHostSim and TestNCCLEPFP8OnHostSim (the fp8 layer on the fake GPUs)")
	rv, out := distributedSetup(t)
	ep, err := hostsim.BuildFake("fakencclep", t.TempDir(), "libnccl_ep.so.0")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("MOEBENCH_NCCL_EP", ep)
	t.Setenv("FAKENCCL_VERSION", "23007") // NCCL with the Device API
	hostsim.FakeNCCLEPRuntime(t)
	flags := func(hidden int, more ...string) []string {
		return append([]string{"--device", "cuda", "--precision", "fp8", "--ep", "4", "--experts", "16", "--tokens", "16", "--hidden", fmt.Sprint(hidden),
			"--ffn", "16", "--warmup", "1", "--iters", "2", "--rendezvous", rv, "--out", out, "--format", "json",
			"--comm-timeout", commTimeout(t), "--ncclep-timeout", commTimeout(t)}, more...)
	}
	for _, c := range []struct {
		name string
		args []string
	}{
		{"alltoall-nccl", []string{"--dispatcher", "alltoall", "--impl", "library"}},
		{"hybridep-domain-2", []string{"--dispatcher", "hybridep", "--sms", "2", "--domain", "2"}},
		{"hybridep-ncclep", []string{"--dispatcher", "hybridep", "--impl", "library"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			os.Remove(out)
			ps := launchProcsEnv(t, 2, nil, flags(512, c.args...)...)
			rec := runRecord(t, out, ps)
			for r, p := range ps {
				if strings.Contains(p.stderr.String(), "NCCL EP: ") { // the fake's complaint: a broken contract
					t.Errorf("process %d: the fake NCCL EP refused a call:\n%s", r, p.stderr.String())
				}
			}
			g := rec.Correctness.Grads
			if rec.Config.Precision != "fp8" || rec.Config.Pass != results.PassTraining || g == nil || !(g.MaxRelErr <= g.Tolerance) ||
				!strings.Contains(g.Note, "each process compares its own ranks'") || !strings.HasPrefix(rec.GEMM.Method, layer.ExpertPathFP8Dev) || rec.GEMM.FP8Path != "cublaslt-fp8-block" {
				t.Fatalf("precision %q, pass %q (%q), expert path %q, gradients %+v", rec.Config.Precision, rec.Config.Pass, rec.Config.PassNote, rec.GEMM.Method, g)
			}
			if !rec.Correctness.Passed {
				t.Fatalf("check %+v", rec.Correctness)
			}
			quantize := false
			for _, ph := range rec.Timing.Phases {
				if ph.Name == "quantize" {
					quantize = len(ph.PerRank) == 4
					for _, v := range ph.PerRank {
						quantize = quantize && v > 0
					}
				}
			}
			if !quantize || rec.Traffic == nil || !strings.Contains(rec.Traffic.Formula, "e4m3") {
				t.Errorf("quantize phase on every rank: %v; traffic %+v", quantize, rec.Traffic)
			}
			t.Logf("%s; max rel err %.2e, gradients %.2e", rec.Ranks.Note, rec.Correctness.MaxRelErr, g.MaxRelErr)
		})
	}
	t.Run("hybridep-hidden-384", func(t *testing.T) {
		os.Remove(out)
		ps := launchProcs(t, 2, flags(384, "--dispatcher", "hybridep", "--sms", "2", "--domain", "2")...)
		for r, p := range ps {
			err := p.wait(t, 2*time.Minute)
			msg := p.stdout.String() + p.stderr.String()
			if err == nil || !strings.Contains(msg, "hidden a multiple of 512") {
				t.Errorf("process %d: %v; output:\n%s", r, err, msg)
			}
			if strings.Contains(p.stderr.String(), "ncclCommInitRank") {
				t.Errorf("process %d met in NCCL for a run it refuses:\n%s", r, p.stderr.String())
			}
		}
		if recs, _ := results.ReadFile(out, nil); len(recs) != 1 || recs[0].Status != results.StatusUnavailable || !strings.Contains(recs[0].Reason, "multiple of 512") {
			t.Errorf("%d records: %+v", len(recs), recs)
		}
	})
}
