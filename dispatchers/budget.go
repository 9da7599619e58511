package dispatchers

import "fmt"

// SMBudget is how an SM-driven dispatcher reads --sms: the thread blocks
// (one per SM) of its transfer kernels.
type SMBudget struct {
	Default int  // the budget --sms 0 means
	Even    bool // must be even (the design pairs a sending and a receiving block)
	// About says where the default and the rule come from, for messages.
	About string
}

// MaxSMBudget bounds any budget: more blocks than any GPU has SMs (an H100
// has 132) only grows the queues.
const MaxSMBudget = 1024

var budgets = map[string]SMBudget{}

// RegisterSMBudget marks a registered dispatcher as SM-driven, with its
// budget rules; called from the dispatcher packages' init functions.
func RegisterSMBudget(name string, b SMBudget) {
	if _, dup := budgets[name]; dup {
		panic("dispatchers: SM budget of " + name + " registered twice")
	}
	budgets[name] = b
}

var libraryBudgets = map[string]SMBudget{}

// RegisterLibrarySMBudget gives a design's library implementation its own
// reading of --sms (the library's SM setting).
func RegisterLibrarySMBudget(name string, b SMBudget) {
	if _, dup := libraryBudgets[name]; dup {
		panic("dispatchers: library SM budget of " + name + " registered twice")
	}
	libraryBudgets[name] = b
}

// SMBudgetOf returns the budget rules of an SM-driven dispatcher's
// implementation impl (a library's own where it registered them); ok is
// false for the others, which --sms does not concern.
func SMBudgetOf(name, impl string) (b SMBudget, ok bool) {
	if b, ok = libraryBudgets[name]; ok && impl == ImplLibrary {
		return b, ok
	}
	b, ok = budgets[name]
	return b, ok
}

// Check says why n is not a budget this dispatcher accepts (0: the default).
func (b SMBudget) Check(n int) error {
	switch {
	case n < 0 || n > MaxSMBudget:
		return fmt.Errorf("must be in [0, %d] (0 = the default, %d)", MaxSMBudget, b.Default)
	case b.Even && n%2 != 0:
		return fmt.Errorf("must be even: %s (0 = the default, %d)", b.About, b.Default)
	}
	return nil
}

// Resolve is the budget n means: n, or the default when n is 0.
func (b SMBudget) Resolve(n int) int {
	if n == 0 {
		return b.Default
	}
	return n
}

// PerGPU is the most a rank's budget may be on a GPU of sms SMs shared by
// ranks of the run's ranks: each block holds one SM (kernels'
// LaunchResident) and all of the GPU's ranks' blocks are resident at once
// (a collective launch), so budget × ranks ≤ SMs; even where b.Even.
func (b SMBudget) PerGPU(sms, ranks int) int {
	n := sms / max(1, ranks)
	if b.Even {
		n -= n % 2
	}
	return n
}

// Fit is the budget n (0: the default) means for the ranks of a GPU of
// sms SMs shared by ranks ranks: n itself when it fits (PerGPU), and for
// 0 the smaller of the default and what fits. An n above what fits, or a
// GPU with too few SMs for any budget, is the reason the design is
// unavailable there (naming --sms, its value, the SMs and the ranks).
func (b SMBudget) Fit(n, sms, ranks int) (int, error) {
	most, least := b.PerGPU(sms, ranks), 1
	if b.Even {
		least = 2
	}
	gpu := fmt.Sprintf("the GPU's %d SMs ÷ its %d rank(s), a block holding one SM and every rank's blocks resident at once", sms, ranks)
	switch {
	case most < least:
		return 0, fmt.Errorf("--sms %d: no budget fits: %s leave %d per rank, below the least, %d", n, gpu, sms/max(1, ranks), least)
	case n == 0:
		return min(b.Default, most), nil
	case n > most:
		return 0, fmt.Errorf("--sms %d: a rank's budget is at most %d: %s", n, most, gpu)
	}
	return n, nil
}
