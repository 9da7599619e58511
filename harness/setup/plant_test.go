package setup

import (
	"strings"
	"testing"
	"time"
)

// TestPlantedDelay: the test-only hook names a delay per dispatcher,
// none for the others or when unset, and refuses a malformed or
// unbounded value naming the variable.
func TestPlantedDelay(t *testing.T) {
	t.Setenv(PlantEnv, "")
	if d, err := PlantedDelay("deepep"); d != 0 || err != nil {
		t.Errorf("unset: %v, %v", d, err)
	}
	t.Setenv(PlantEnv, "alltoall=5ms, deepep=1s")
	for name, want := range map[string]time.Duration{"alltoall": 5 * time.Millisecond, "deepep": time.Second, "hybridep": 0} {
		if d, err := PlantedDelay(name); d != want || err != nil {
			t.Errorf("%s: %v, %v; want %v", name, d, err, want)
		}
	}
	for _, bad := range []string{"deepep", "deepep=fast", "deepep=-1s", "deepep=2h"} {
		t.Setenv(PlantEnv, bad)
		if _, err := PlantedDelay("deepep"); err == nil || !strings.Contains(err.Error(), PlantEnv) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}
