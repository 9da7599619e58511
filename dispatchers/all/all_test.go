package all

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/moebench/moebench/dispatchers"
	dt "github.com/moebench/moebench/dispatchers/dispatchtest"
)

// TestDeepEPNames: deepep is DeepEP's normal mode and deepep-ll its
// low-latency design, each name one design. deepep --impl library is
// unavailable (no library of the normal mode is reachable from Go) and
// points at deepep-ll --impl library; deepep-ll --impl library is NCCL EP's
// low-latency mode (here, with no NCCL EP, unavailable under that name);
// native deepep-ll is unavailable, with the reason, on both devices.
func TestDeepEPNames(t *testing.T) {
	if !slices.Contains(dispatchers.Names(), "deepep-ll") {
		t.Fatalf("deepep-ll is not registered: %v", dispatchers.Names())
	}
	unavailable := func(what string, err error, name, impl string, want ...string) {
		t.Helper()
		var u *dispatchers.UnavailableError
		if !errors.As(err, &u) || u.Name != name || u.Impl != impl {
			t.Errorf("%s: %v; want %s (%s) unavailable", what, err, name, impl)
			return
		}
		for _, w := range want {
			if !strings.Contains(u.Reason, w) {
				t.Errorf("%s: reason %q; want it to say %q", what, u.Reason, w)
			}
		}
	}
	normal := []string{"no library of DeepEP's normal mode is reachable from Go", "PyTorch extension", "deepep-ll --impl library"}
	_, err := dispatchers.New("deepep", dispatchers.ImplLibrary, dispatchers.Env{Device: "host"})
	unavailable("deepep library, host", err, "deepep", dispatchers.ImplLibrary, normal...)
	_, err = dispatchers.NewDevice("deepep", dispatchers.ImplLibrary, dispatchers.Env{Device: "cuda"})
	unavailable("deepep library, cuda", err, "deepep", dispatchers.ImplLibrary, normal...)

	native := []string{"not built yet", "low-latency", "deepep-ll --impl library"}
	_, err = dispatchers.New("deepep-ll", dispatchers.ImplNative, dispatchers.Env{Device: "host"})
	unavailable("deepep-ll native, host", err, "deepep-ll", dispatchers.ImplNative, native...)
	_, err = dispatchers.NewDevice("deepep-ll", dispatchers.ImplNative, dispatchers.Env{Device: "cuda"})
	unavailable("deepep-ll native, cuda", err, "deepep-ll", dispatchers.ImplNative, native...)

	_, err = dispatchers.New("deepep-ll", dispatchers.ImplLibrary, dispatchers.Env{Device: "host"})
	unavailable("deepep-ll library, host", err, "deepep-ll", dispatchers.ImplLibrary, "NCCL EP cannot run here")
	if d, err := dispatchers.NewDevice("deepep-ll", dispatchers.ImplLibrary, dispatchers.Env{Device: "cuda"}); err == nil {
		if d.Name() != "deepep-ll" || d.Impl() != dispatchers.ImplLibrary {
			t.Errorf("deepep-ll library: %s (%s)", d.Name(), d.Impl())
		}
	} else {
		unavailable("deepep-ll library, cuda", err, "deepep-ll", dispatchers.ImplLibrary, "NCCL EP")
	}
	if b, ok := dispatchers.SMBudgetOf("deepep-ll", dispatchers.ImplLibrary); !ok || !strings.Contains(b.About, "NCCL EP's max_num_sms") {
		t.Errorf("deepep-ll library's SM budget: %+v, %v", b, ok)
	}
	if _, ok := dispatchers.SMBudgetOf("deepep-ll", dispatchers.ImplNative); ok {
		t.Error("native deepep-ll, which does not exist, has an SM budget")
	}
}

// TestContract: every registered dispatcher that can be made here, on the
// host and on the cuda device (made, not bound), keeps the contract
// (dispatchtest.Contract); feplb refuses a base whose phases are its own.
func TestContract(t *testing.T) {
	made := 0
	for _, name := range dispatchers.Names() {
		for _, impl := range []string{dispatchers.ImplNative, dispatchers.ImplLibrary} {
			if d, err := dispatchers.New(name, impl, dispatchers.Env{Device: "host", Hidden: 512, FFN: 256}); err == nil {
				dt.Contract(t, d)
				made++
			}
			if d, err := dispatchers.NewDevice(name, impl, dispatchers.Env{Device: "cuda", Hidden: 512, FFN: 256}); err == nil {
				dt.Contract(t, d)
				made++
			}
		}
	}
	if made < 8 {
		t.Errorf("%d dispatchers made, want the host's and device's of alltoall, deepep, hybridep and feplb", made)
	}
	for _, dev := range []string{"host", "cuda"} {
		env := dispatchers.Env{Device: dev, Base: "deepep", Hidden: 512, FFN: 256}
		var err error
		if dev == "host" {
			_, err = dispatchers.New("feplb", dispatchers.ImplNative, env)
		} else {
			_, err = dispatchers.NewDevice("feplb", dispatchers.ImplNative, env)
		}
		if !dispatchers.IsUnavailable(err) || !strings.Contains(err.Error(), "base dispatcher deepep (native): it cannot be the base of a two-phase dispatcher: its phases are its own (layout, notify, dispatch, permute, experts, combine)") {
			t.Errorf("feplb over deepep on %s: %v", dev, err)
		}
	}
}
