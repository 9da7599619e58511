package setup

// DispatcherMovesWeights says whether c's dispatcher moves whole experts' weights
// and weight gradients between ranks (reading Rank.Experts and adding to
// Rank.ExpertGrads), which needs them held.
func DispatcherMovesWeights(c Config) bool { return c.Dispatcher == "feplb" }

// ResolvedHostExperts is c's mode (HostExpertsHeld on the cuda device, whose host
// side holds no expert weights), auto resolved to the first mode whose
// estimated memory fits in the available memory, or the smallest.
func (c Config) ResolvedHostExperts() string {
	switch {
	case c.Device == "cuda":
		return HostExpertsHeld
	case c.HostExperts != "" && c.HostExperts != HostExpertsAuto:
		return c.HostExperts
	case DispatcherMovesWeights(c):
		return HostExpertsHeld
	}
	modes := []string{HostExpertsHeld, HostExpertsByRank, HostExpertsDrawn}
	if c.ForwardOnly { // no weight gradients
		modes = []string{HostExpertsHeld, HostExpertsDrawn}
	}
	avail, ok := MemAvailable()
	for _, m := range modes[:len(modes)-1] {
		if !ok || FitsMemory(float64(HostBytesForExpertMode(c, m)), avail) {
			return m
		}
	}
	return modes[len(modes)-1]
}
