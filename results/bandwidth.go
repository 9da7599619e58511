package results

// CopyFormula says how CopyPayload counts.
const CopyFormula = "moebench's per-copy convention: " + copyRows

const copyRows = "every (token, expert) copy's bf16 row, a rank's copies to itself included: EP × tokens × top-k × hidden × 2 B"

// CopyPayload is c's bytes in moebench's per-copy convention (CopyFormula),
// all ranks together. Dropless routing gives every token k copies, so it is
// the same for every dispatcher of a workload: its GB/s compare
// dispatchers as their times do, whatever each design deduplicates.
func CopyPayload(c Config) int64 {
	return int64(c.EP) * int64(c.Tokens) * int64(c.TopK) * int64(c.Hidden) * 2
}

// GBps is a rank's share of bytes (all ep ranks together) over ms
// milliseconds, in GB/s (1e9 B/s); 0 when ms is not positive.
func GBps(bytes int64, ep int, ms float64) float64 {
	if ms <= 0 || ep <= 0 {
		return 0
	}
	return float64(bytes) / float64(ep) / (ms / 1e3) / 1e9
}

// copyGBps is the per-copy GB/s of r's phase (dispatch or combine): the
// record's, or for an older record computed from its configuration.
func copyGBps(r *Record, phase string) float64 {
	if t := r.Traffic; t != nil && t.CopyBytes > 0 {
		if phase == "combine" {
			return t.CombineCopyGBps
		}
		return t.DispatchCopyGBps
	}
	return GBps(CopyPayload(r.Config), r.Config.EP, phaseP50(r, phase))
}
