package bench

import (
	"strings"
	"testing"

	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/results"
)

// TestMXFP8BenchDispatch: bench dispatch at mxfp8 on the host sends
// alltoall's rows as e4m3 with E8M0 1×32 scales (ToMXFP8) and gets each
// rank's dequantized input back exactly, its dispatch bytes bf16's ×
// (512 + 16)/1024; deepep, whose FP8 layout is 1×128, is unavailable with
// its reason — never bf16 rows under an mxfp8 label.
func TestMXFP8BenchDispatch(t *testing.T) {
	c := harnesstest.FP8Config("alltoall")
	c.Tokens, c.Iters, c.Warmup = 16, 2, 0
	b, err := DispatchAt(c, []string{"alltoall", "deepep"}, []int{4}, []string{setup.PrecisionBF16, setup.PrecisionMXFP8}, setup.Env{Version: "test"})
	if b == nil || len(b.Points) != 4 {
		t.Fatalf("%v, %+v", err, b)
	}
	bf, mx := b.Points[0], b.Points[1]
	if bf.Status != results.StatusOK || mx.Status != results.StatusOK || mx.Precision != setup.PrecisionMXFP8 || mx.RoundTrip != "exact" {
		t.Fatalf("alltoall: bf16 %s %q, mxfp8 %s %q (%q, %s)", bf.Status, bf.Reason, mx.Status, mx.Reason, mx.Precision, mx.RoundTrip)
	}
	if mx.Traffic.DispatchAlgorithm*1024 != bf.Traffic.DispatchAlgorithm*528 || mx.Traffic.CombineAlgorithm != bf.Traffic.CombineAlgorithm {
		t.Errorf("alltoall: dispatch bytes %d (mxfp8) and %d (bf16)", mx.Traffic.DispatchAlgorithm, bf.Traffic.DispatchAlgorithm)
	}
	if d := b.Points[3]; d.Status != results.StatusUnavailable || d.Precision != setup.PrecisionMXFP8 || !strings.Contains(d.Reason, "fp32 scale per 1×128 block") {
		t.Errorf("deepep at mxfp8: %s %q", d.Status, d.Reason)
	}
}
