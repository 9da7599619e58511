package setup

import (
	"runtime"
)

// RefFLOPBudget bounds the float64 reference's expert work (all experts'
// rows, 6·h·f per row): beyond it the check compares a seeded sample of
// tokens per rank.
var RefFLOPBudget = 4e9

// SampledTokens is how many tokens per rank the device check compares (see
// sample).
func SampledTokens(c Config) int {
	if c.CheckAll {
		return c.Tokens
	}
	perToken := 6 * float64(c.Hidden) * float64(c.FFN) * float64(c.TopK+c.SharedExperts)
	if float64(c.EP*c.Tokens)*perToken <= RefFLOPBudget {
		return c.Tokens
	}
	return min(c.Tokens, max(16, int(RefFLOPBudget/perToken)/c.EP))
}

// SumChunk bounds the bytes one round of sumOverProcesses gathers from all
// processes together (on the device and on the host).
const SumChunk = 16 << 20

// DrawBudget bounds the weights of the experts a drawn layer holds at
// once (see ExpertsDrawnAtOnce; a variable for tests).
var DrawBudget float64 = 1 << 30

// ExpertsDrawnAtOnce is how many experts' weights a drawn layer holds at once: one
// per CPU (each draws its own), as many as DrawBudget holds, at least 1.
func ExpertsDrawnAtOnce(c Config) int {
	return max(1, min(runtime.GOMAXPROCS(0), c.Experts, int(DrawBudget/(4*3*float64(c.Hidden)*float64(c.FFN)))))
}

// ExpertBlock is the most rows of one expert computed at once: a larger
// segment is computed in blocks (rows are independent: the same results),
// which bounds each worker's scratch and spreads a big expert over workers.
const ExpertBlock = 256
