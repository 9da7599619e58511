package harness

import (
	"strings"
	"testing"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/harness/layer"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/internal/hostsim"
	"github.com/moebench/moebench/results"
)

// TestFP8AlltoallLibraryOnHostSim: alltoall's library implementation at
// fp8 — its NCCL group's sends and receives moving the packed rows (e4m3
// values and their 1×128 fp32 multipliers) that the native one copies —
// runs a training step on hostsim over the fake NCCL (two GPUs, one rank
// each) that passes the check, at hidden 512 and at 384 (a padded packed
// row), and its output, received rows and traffic equal the host device's
// fp8 layer's bit for bit, as the native path's do.
func TestFP8AlltoallLibraryOnHostSim(t *testing.T) {
	harnesstest.UseHostSimLayer(t)
	for _, name := range []string{"alltoall", "alltoall-h384"} {
		t.Run(name, func(t *testing.T) {
			if name != "alltoall" {
				hostsim.SkipIfShort(t, "alltoall")
			}
			c := harnesstest.FP8DeviceCases()[name]
			c.Impl, c.EP, c.Warmup, c.Iters = dispatchers.ImplLibrary, 2, 0, 1
			rec, err := Run(c, setup.Env{Version: "test"})
			if err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed || rec.Correctness.Grads == nil {
				t.Fatalf("%v, %s %q, %+v", err, rec.Status, rec.Reason, rec.Correctness)
			}
			if rec.Config.Precision != setup.PrecisionFP8 || rec.Config.Impl != dispatchers.ImplLibrary || !strings.Contains(rec.Traffic.Formula, "e4m3") {
				t.Errorf("record: precision %q, impl %q, traffic %q", rec.Config.Precision, rec.Config.Impl, rec.Traffic.Formula)
			}
			t.Logf("max rel err %.2e, gradients %.2e", rec.Correctness.MaxRelErr, rec.Correctness.Grads.MaxRelErr)
			devs, err := layer.OpenDevices(setup.Env{}, 2, 2, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { layer.CloseDevices(devs) })
			equalsHostOn(t, c, devs...)
		})
	}
}
