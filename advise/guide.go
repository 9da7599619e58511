package advise

import (
	"fmt"
	"strings"

	"github.com/moebench/moebench/results"
)

// GuideSource is the static dispatcher selection guide whose advice
// StaticGuide restates (rounded, in moebench's words): NVIDIA NeMo
// Megatron-Bridge's MoE dispatcher selection skill
// (skills/nemo-mbridge-perf-moe-dispatcher-selection; in this project
// shared/reference/seeds/000_de1acdb2763a12a5.txt).
const GuideSource = "NeMo Megatron-Bridge's MoE dispatcher selection guide"

// StaticGuide is the guide's advice for a GPU model (cuda device; "" or
// the host device: unknown hardware) and a preset's model family.
func StaticGuide(device, gpu, preset string) Guide {
	g := Guide{}
	m := strings.ToUpper(gpu)
	class := ""
	switch {
	case device == "host" || gpu == "":
		g.Hardware = "unknown hardware or first bring-up (the host device is not a GPU)"
		g.Pick, g.Advice = "alltoall", "alltoall: the easiest path to correctness and debugging (its model-family rows assume a known GPU)"
	case strings.Contains(m, "GB200") || strings.Contains(m, "GB300"):
		class = "gb200"
		g.Hardware = "GB200 / GB300 NVL72"
		g.Pick, g.Advice = "hybridep", "HybridEP where its runtime is installed: NVLink-domain-aware dispatch, less memory pressure"
	case strings.Contains(m, "B200") || strings.Contains(m, "B300"):
		class = "b200"
		g.Hardware = "B200"
		g.Pick, g.Advice = "deepep", "DeepEP where its runtime is installed, unless a platform-specific HybridEP path exists"
	case strings.Contains(m, "H100") || strings.Contains(m, "H200") || strings.Contains(m, "H800") || strings.Contains(m, "H20"):
		class = "h100"
		g.Hardware = "H100 (Hopper; the guide's H100 row)"
		g.Pick, g.Advice = "deepep", "DeepEP where its runtime is installed: the strong default for EP on Hopper"
	default:
		g.Hardware = "unknown hardware (" + gpu + ") or first bring-up"
		g.Pick, g.Advice = "alltoall", "alltoall: the easiest path to correctness and debugging (its model-family rows assume a known GPU)"
	}
	base := strings.TrimSuffix(preset, "+custom")
	switch {
	case strings.HasPrefix(base, "qwen3-30b"):
		g.Model = "Qwen3 30B: DeepEP (smaller models still gain, by less)"
		if class != "" {
			g.Pick = "deepep"
		}
	case strings.HasPrefix(base, "qwen3-235b"):
		g.Model = "Qwen3 235B: DeepEP on H100, HybridEP on GB200 (often with less memory)"
		if class == "gb200" {
			g.Pick = "hybridep"
		} else if class != "" {
			g.Pick = "deepep"
		}
	case strings.HasPrefix(base, "deepseek-v3"):
		g.Model = "DeepSeek-V3 at scale: HybridEP on GB200/GB300, DeepEP on H100"
		if class == "gb200" {
			g.Pick = "hybridep"
		} else if class != "" {
			g.Pick = "deepep"
		}
	case strings.HasPrefix(base, "qwen3-next"):
		g.Model = "Qwen3-Next: a close race in BF16, HybridEP stronger in FP8 or tight memory; the guide's own words: test, do not assume"
		if class != "" {
			g.Pick = ""
		}
	}
	return g
}

// agreement is the sentence that sets the guide's pick beside the
// measured answer (winner: the winning design).
func agreement(a *Answer, winner string) string {
	g, d := a.Guide, a.Decision
	if winner == "" {
		return fmt.Sprintf("No design ran correctly here, so nothing is measured to set beside the guide (%s).", pickOr(g.Pick))
	}
	if g.Pick == "" {
		return fmt.Sprintf("The guide names no single design for this case; measured here: %s.", d.Winner)
	}
	var gated []string
	for _, gt := range a.Gate {
		if gt.Dispatcher == g.Pick && !gt.Available {
			gated = append(gated, gt.Impl+": "+gt.Reason)
		}
	}
	pickFinal := (*Final)(nil)
	for _, f := range a.Finalists {
		if f.Dispatcher == g.Pick && f.Status == results.StatusOK && (pickFinal == nil || f.P50 < pickFinal.P50) {
			pickFinal = f
		}
	}
	switch {
	case pickFinal == nil && len(gated) > 0:
		return fmt.Sprintf("The guide's pick, %s, could not run here (%s); the measured answer is %s.", g.Pick, strings.Join(gated, "; "), d.Winner)
	case winner == g.Pick && d.Separated:
		return fmt.Sprintf("The measurement agrees with the guide: %s is the fastest here.", d.Winner)
	case winner == g.Pick:
		return fmt.Sprintf("The guide's pick, %s, has the fastest median here, but the measurement does not separate it from %s.", g.Pick, d.RunnerUp)
	case pickFinal != nil && !d.Separated && pickFinal.Label() == d.RunnerUp:
		return fmt.Sprintf("The guide picks %s; here %s and %s show no significant difference, so following the guide costs nothing measurable.", g.Pick, d.Winner, d.RunnerUp)
	case pickFinal != nil && !d.Separated:
		return fmt.Sprintf("The guide picks %s; the measurement separates no finalist here (%s leads by its median only; %s's median step %+.1f%% against it), so it does not contradict the guide.",
			g.Pick, d.Winner, pickFinal.Label(), 100*(pickFinal.P50/winnerP50(a)-1))
	case pickFinal != nil:
		return fmt.Sprintf("The measurement disagrees with the guide: it picks %s, but %s was faster here (%s's median step %+.1f%% against the winner's).",
			g.Pick, d.Winner, pickFinal.Label(), 100*(pickFinal.P50/winnerP50(a)-1))
	}
	return fmt.Sprintf("The measurement disagrees with the guide: it picks %s, which did not finish a correct run here; %s did.", g.Pick, d.Winner)
}

// winnerP50 is the winner's pooled median step.
func winnerP50(a *Answer) float64 {
	for _, f := range a.Finalists {
		if f.Label() == a.Decision.Winner {
			return f.P50
		}
	}
	return 0
}

func pickOr(p string) string {
	if p == "" {
		return "it names no single design for this case"
	}
	return "it picks " + p
}
