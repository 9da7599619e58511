package setup

import (
	"fmt"
)

// BuildExperts is the progress stage of drawing the experts' weights.
const BuildExperts = "building the layer: drawing the experts' weights (experts)"

// Checking is the progress stage of the correctness check.
const Checking = "checking the output against the float64 reference"

// StepStage is the progress stage of step i (negative: warm-up).
func StepStage(i int, cfg Config) string {
	if i < 0 {
		return fmt.Sprintf("warm-up step %d of %d", cfg.Warmup+i+1, cfg.Warmup)
	}
	return fmt.Sprintf("timed step %d of %d", i+1, cfg.Iters)
}
