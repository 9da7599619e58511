package setup

import (
	"fmt"
	"slices"
	"strings"
)

// ParseOverlap splits --overlap's comma-separated forms ("" or "none":
// none).
func ParseOverlap(s string) []string {
	if s == "" || s == "none" {
		return nil
	}
	var out []string
	for _, f := range strings.Split(s, ",") {
		out = append(out, strings.TrimSpace(f))
	}
	return out
}

// validateOverlap checks --overlap and --delay-wgrad.
func (c Config) validateOverlap() error {
	v := strings.Join(c.Overlap, ",")
	for i, f := range c.Overlap {
		if !slices.Contains(OverlapForms, f) {
			return &ConfigError{"overlap", v, "allowed: a comma-separated list of " + strings.Join(OverlapForms, ", ") + " (or none)"}
		}
		if slices.Contains(c.Overlap[:i], f) {
			return &ConfigError{"overlap", v, "names " + f + " twice; allowed: " + strings.Join(OverlapForms, ", ")}
		}
	}
	switch {
	case !(c.AttentionMS >= 0 && c.AttentionMS <= MaxAttentionMS):
		return &ConfigError{"attention-ms", c.AttentionMS, fmt.Sprintf("must be in [0, %d] (0 = no attention stand-in)", MaxAttentionMS)}
	case c.AttentionMS > 0 && c.Device == "host":
		return &ConfigError{"attention-ms", c.AttentionMS, "applies to the cuda device: the host device runs the phases one after another, so the stand-in would hide nothing"}
	case c.Overlaps(OverlapShared) && c.Overlaps(OverlapA2A):
		return &ConfigError{"overlap", v, "shared and a2a together are refused: " + SharedA2AConflict}
	case (c.Overlaps(OverlapA2A) || c.DelayWgrad) && c.ForwardOnly:
		flag, val := "overlap", any(v)
		if c.DelayWgrad {
			flag, val = "delay-wgrad", true
		}
		return &ConfigError{flag, val, "overlaps a training step's backward; --forward-only has none"}
	case c.Overlaps(OverlapShared) && c.SharedExperts == 0:
		return &ConfigError{"overlap", v, "shared overlaps the shared expert, and the layer has none (--shared-experts 0)"}
	}
	return nil
}

// Overlaps reports whether c asks for overlap form f.
func (c Config) Overlaps(f string) bool { return slices.Contains(c.Overlap, f) }

// Overlapping reports whether c asks for any overlap (a form or a delayed
// wgrad).
func (c Config) Overlapping() bool { return len(c.Overlap) > 0 || c.DelayWgrad }
