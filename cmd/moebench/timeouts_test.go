package main

import (
	"strings"
	"testing"
	"time"

	"github.com/moebench/moebench/harness/setup"
)

// TestTimeoutsOneMeaningEach: --comm-timeout bounds moebench's own
// cross-rank waits (a native dispatcher's, the processes'), --ncclep-timeout
// NCCL EP's timeout_ns, --watchdog-timeout a call on a GPU's thread (0:
// derived from the two); each is set by its flag alone, recorded where it
// applies, bounded with its range in the error, and documented in --help.
func TestTimeoutsOneMeaningEach(t *testing.T) {
	config := func(args ...string) setup.Config {
		t.Helper()
		var o options
		fs := newFlags(&o)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		c, err := o.config(fs)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return c
	}
	lib := []string{"--dispatcher", "hybridep", "--impl", "library", "--device", "cuda"}
	c := config(append(lib, "--comm-timeout", "9s")...)
	if c.CommTimeout != 9*time.Second || c.NCCLEPTimeout != 5*time.Second {
		t.Errorf("--comm-timeout 9s: comm %v, NCCL EP %v; want 9s and the default 5s", c.CommTimeout, c.NCCLEPTimeout)
	}
	if r := c.Record(); r.NCCLEPTimeoutS != 5 || r.CommTimeoutS != 0 || r.WatchdogTimeoutS != 54 {
		t.Errorf("NCCL EP's record: comm %v s, NCCL EP %v s, watchdog %v s; want 0, 5, 54 (6 × 9s)", r.CommTimeoutS, r.NCCLEPTimeoutS, r.WatchdogTimeoutS)
	}
	c = config(append(lib, "--ncclep-timeout", "7s", "--watchdog-timeout", "2m")...)
	if c.CommTimeout != 5*time.Second || c.NCCLEPTimeout != 7*time.Second || c.WatchdogLimit() != 2*time.Minute {
		t.Errorf("--ncclep-timeout 7s: comm %v, NCCL EP %v, watchdog %v", c.CommTimeout, c.NCCLEPTimeout, c.WatchdogLimit())
	}
	if r := c.Record(); r.NCCLEPTimeoutS != 7 || r.WatchdogTimeoutS != 120 {
		t.Errorf("record: NCCL EP %v s, watchdog %v s", r.NCCLEPTimeoutS, r.WatchdogTimeoutS)
	}
	c = config("--dispatcher", "deepep", "--comm-timeout", "9s", "--ncclep-timeout", "7s", "--device", "host")
	if r := c.Record(); r.CommTimeoutS != 9 || r.NCCLEPTimeoutS != 0 || r.WatchdogTimeoutS != 0 {
		t.Errorf("native deepep on the host: comm %v s, NCCL EP %v s, watchdog %v s; want 9, 0, 0", r.CommTimeoutS, r.NCCLEPTimeoutS, r.WatchdogTimeoutS)
	}
	if l := config("--ncclep-timeout", "20s").WatchdogLimit(); l != 2*time.Minute {
		t.Errorf("derived watchdog with --ncclep-timeout 20s: %v; want 2m", l)
	}
	if l := config().WatchdogLimit(); l != 30*time.Second {
		t.Errorf("default watchdog: %v; want 30s", l)
	}
	for _, c := range []struct{ args, want string }{
		{"--ncclep-timeout=-1s", "--ncclep-timeout=-1s: must be in [1ms, 1h] (0 = the default, 5s)"},
		{"--ncclep-timeout=2h", "--ncclep-timeout=2h0m0s: must be in [1ms, 1h]"},
		{"--watchdog-timeout=500ms", "--watchdog-timeout=500ms: must be 0 (6 × the longer of --comm-timeout and NCCL EP's timeout (--ncclep-timeout, or NCCL_EP_TIMEOUT_MS where set), at least 30s) or in [1s, 24h]"},
		{"--watchdog-timeout=25h", "--watchdog-timeout=25h0m0s: must be 0"},
		{"--watchdog-timeout=10s --comm-timeout=20s", "--watchdog-timeout=10s: must be above --comm-timeout (20s) and NCCL EP's timeout (--ncclep-timeout 5s)"},
		{"--watchdog-timeout=10s --ncclep-timeout=10s", "--watchdog-timeout=10s: must be above --comm-timeout (5s) and NCCL EP's timeout (--ncclep-timeout 10s)"},
	} {
		code, _, e := cli(append(quick, strings.Fields(c.args)...)...)
		if code != exitUsage || !strings.Contains(e, c.want) {
			t.Errorf("%s: exit %d, %s; want exit 2 and %q", c.args, code, e, c.want)
		}
	}
	_, help, _ := cli("--help")
	for _, w := range []string{
		"--comm-timeout duration", "moebench's own waits for another rank",
		"--ncclep-timeout duration", "NCCL EP's timeout_ns", "NCCL_EP_TIMEOUT_MS",
		"--watchdog-timeout duration", "0 = 6 × the longer of --comm-timeout and --ncclep-timeout, at least 30s",
	} {
		if !strings.Contains(help, w) {
			t.Errorf("--help does not say %q", w)
		}
	}
}
