package setup

import (
	"strings"
	"testing"
	"time"
)

// TestWatchdogFollowsNCCLEPEnv: NCCL_EP_TIMEOUT_MS, which NCCL EP takes over
// --ncclep-timeout, also sets the watchdog's derived limit and the bound an
// explicit --watchdog-timeout must exceed, so that NCCL EP's own timeout
// ends a wait first and names it.
func TestWatchdogFollowsNCCLEPEnv(t *testing.T) {
	c := DefaultConfig()
	before := c.WatchdogLimit()
	t.Setenv("NCCL_EP_TIMEOUT_MS", "60000")
	if l := c.WatchdogLimit(); l != 6*time.Minute || l == before {
		t.Errorf("NCCL_EP_TIMEOUT_MS=60000: watchdog %v (without it %v), want 6m", l, before)
	}
	c.WatchdogTimeout = 40 * time.Second
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "NCCL_EP_TIMEOUT_MS: 1m0s") {
		t.Errorf("--watchdog-timeout 40s under NCCL_EP_TIMEOUT_MS=60000: %v", err)
	}
	t.Setenv("NCCL_EP_TIMEOUT_MS", "0") // 0: unset for NCCL EP
	if l := DefaultConfig().WatchdogLimit(); l != before {
		t.Errorf("NCCL_EP_TIMEOUT_MS=0: watchdog %v, want %v", l, before)
	}
}
