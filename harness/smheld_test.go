package harness

import (
	"strings"
	"testing"

	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/harness/layer"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/internal/hostsim"
	"github.com/moebench/moebench/kernels/device"
	"github.com/moebench/moebench/results"
)

// TestSMsHeldPacked: a block holds one SM, so EP 8 packed on one GPU of
// 132 SMs (Emu's) gives a rank at most 16: --sms 16 runs and holds 16 SMs
// per rank, --sms 24 is unavailable naming --sms, the SMs and the ranks,
// and --sms 0 resolves to the smaller of the design's default and 16; on
// the host device the budget is recorded as asked and no SMs are held.
func TestSMsHeldPacked(t *testing.T) {
	for _, name := range []string{"deepep", "hybridep"} {
		t.Run(name, func(t *testing.T) {
			cfg := func(sms int) setup.Config {
				c := harnesstest.DeepEPDevice(t, 8, "balanced")
				if name == "hybridep" {
					c = harnesstest.HybridEPConfig(t, 8, 0, "balanced")
				}
				c.GPUs, c.SMs, c.Iters, c.Warmup = 1, sms, 1, 0
				return c
			}
			for _, sms := range []int{16, 0} {
				rec, err := Run(cfg(sms), setup.Env{Version: "test", OpenDevices: harnesstest.Emus(1)})
				if rec == nil {
					t.Fatalf("--sms %d: no record: %v", sms, err)
				}
				if err != nil || rec.Status != results.StatusOK || rec.SMs.Configured != sms || rec.SMs.Budget != 16 || rec.SMs.Held != 16 ||
					!strings.Contains(rec.SMs.HeldNote, "8 ranks packed on a GPU hold 128 of its 132 SMs") {
					t.Fatalf("--sms %d: %v; status %s (%s), SMs %+v", sms, err, rec.Status, rec.Reason, rec.SMs)
				}
			}
			rec, err := Run(cfg(24), setup.Env{Version: "test", OpenDevices: harnesstest.Emus(1)})
			if rec == nil {
				t.Fatalf("--sms 24: no record: %v", err)
			}
			if want := "--sms 24: a rank's budget is at most 16: the GPU's 132 SMs ÷ its 8 rank(s)"; rec == nil || rec.Status != results.StatusUnavailable || !strings.Contains(rec.Reason, want) {
				t.Errorf("--sms 24: %v; status %s (%s), want unavailable: %q", err, rec.Status, rec.Reason, want)
			}
			host := cfg(24)
			host.Device, host.GPUs = "host", 0
			rec, err = Run(host, setup.Env{Version: "test"})
			if err != nil {
				t.Fatal(err)
			}
			if rec.Status != results.StatusOK || rec.SMs.Budget != 24 || rec.SMs.Held != 0 || rec.SMs.HeldNote != layer.HostHeldNote {
				t.Errorf("host --sms 24: %v; status %s (%s), SMs %+v", err, rec.Status, rec.Reason, rec.SMs)
			}
		})
	}
}

// TestSMsHeldOnHostSim: the same on the host simulation's fake GPU of 132
// SMs, deepep.cu's kernels launched with one block per SM: the default
// budget of EP 8 packed on it resolves to 16 and the run passes its check.
func TestSMsHeldOnHostSim(t *testing.T) {
	t.Setenv("FAKECUDA_SMS", "132")
	comp := hostsim.Setup(t)
	old := device.NewCompiler
	device.NewCompiler = func() (device.Compiler, error) { return comp, nil }
	t.Cleanup(func() { device.NewCompiler = old })
	c := harnesstest.DeepEPDevice(t, 8, "balanced")
	c.GPUs, c.SMs, c.Iters, c.Warmup, c.ForwardOnly = 1, 0, 1, 0, true
	rec, err := Run(c, setup.Env{Version: "test"})
	if rec == nil {
		t.Fatalf("no record: %v", err)
	}
	if err != nil || rec.Status != results.StatusOK || !rec.Correctness.Passed || rec.SMs.Budget != 16 || rec.SMs.Held != 16 {
		t.Fatalf("%v; status %s (%s), SMs %+v", err, rec.Status, rec.Reason, rec.SMs)
	}
	c.SMs = 24
	if rec, err = Run(c, setup.Env{Version: "test"}); rec == nil {
		t.Fatalf("--sms 24: no record: %v", err)
	} else if rec.Status != results.StatusUnavailable || !strings.Contains(rec.Reason, "132 SMs ÷ its 8 rank(s)") {
		t.Errorf("--sms 24: %v; status %s (%s)", err, rec.Status, rec.Reason)
	}
}
