package harness

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/moebench/moebench/harness/internal/harnesstest"
	"github.com/moebench/moebench/harness/setup"
)

// TestDumpSaysItsRouting: a dump's index.json says whether the routing was
// drawn per step (config.routing_per_step, false with --routing-fixed) and
// whose step's routing its files hold, so that a replay need not guess.
func TestDumpSaysItsRouting(t *testing.T) {
	for _, fixed := range []bool{false, true} {
		c := harnesstest.Small()
		c.ForwardOnly, c.RoutingFixed = true, fixed
		dir := filepath.Join(t.TempDir(), "dump")
		if _, err := Run(c, setup.Env{Version: "test", Dump: dir}); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(dir, "index.json"))
		if err != nil {
			t.Fatal(err)
		}
		var index struct {
			Config  map[string]any `json:"config"`
			Routing struct {
				PerStep *bool  `json:"per_step"`
				Step    *int   `json:"step"`
				About   string `json:"about"`
			} `json:"routing"`
		}
		if err := json.Unmarshal(b, &index); err != nil {
			t.Fatal(err)
		}
		perStep, ok := index.Config["routing_per_step"].(bool)
		wantStep := c.Warmup + c.Iters // the last timed step's
		if fixed {
			wantStep = 0
		}
		if !ok || perStep == fixed || index.Routing.PerStep == nil || *index.Routing.PerStep == fixed ||
			index.Routing.Step == nil || *index.Routing.Step != wantStep || index.Routing.About == "" {
			t.Errorf("--routing-fixed=%v: config.routing_per_step %v (%v), routing %+v; want step %d", fixed, perStep, ok, index.Routing, wantStep)
		}
	}
}
