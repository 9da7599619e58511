package layer

import (
	"strings"
	"testing"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/kernels/device"
)

// TestHybridEPDeviceUnavailable: an SM budget the devices cannot hold
// resident, a domain whose devices lack peer access, and domains without
// one device per rank (no NCCL) are unavailable, with the reason.
func TestHybridEPDeviceUnavailable(t *testing.T) {
	for _, c := range []struct {
		name   string
		ep, sm int
		domain int
		devs   []device.Device
		want   string
	}{
		{"budget", 2, 3, 0, []device.Device{&device.Emu{SMs: 4}}, "--sms 3 for each of 2 ranks on emu: he_allgather: 6 blocks of 128 threads cannot all be resident at once on emu: it holds 1 per SM × 4 SMs = 4"},
		{"budget-above-sms", 2, 5, 0, []device.Device{&device.Emu{SMs: 4}, &device.Emu{SMs: 4}}, "--sms 5: a rank's budget above the 4 SMs of emu"},
		{"peer", 2, 1, 0, []device.Device{&harnesstest.Island{}, &harnesstest.Island{}}, "share an NVLink domain (--domain 2) but rank 0's GPU has no peer access to rank 1's"},
		{"nccl", 4, 1, 2, []device.Device{&device.Emu{}, &device.Emu{}}, "the inter-domain path (NCCL send/recv"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := harnesstest.HybridEPConfig(t, c.ep, c.domain, "balanced")
			cfg.SMs = c.sm
			l, err := MakeLayer(cfg, false)
			if err != nil {
				t.Fatal(err)
			}
			d, err := dispatchers.NewDevice("hybridep", "native", cfg.DispatcherEnv())
			if err != nil {
				t.Fatal(err)
			}
			th := device.NewThreads(c.devs)
			defer th.Close()
			_, err = NewDeviceLayer(l, c.devs, th, d, nil)
			if !dispatchers.IsUnavailable(err) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%v: want unavailable, %q", err, c.want)
			}
			t.Log(err)
		})
	}
}
