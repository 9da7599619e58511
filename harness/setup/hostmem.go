package setup

import (
	"runtime"
)

// RefBlock is how many rows of one expert the float64 reference computes at
// once; refWeightBudget bounds the widened weights of the experts it
// computes at once (see refWorkers).
const (
	RefBlock        = 1024
	refWeightBudget = 1 << 30
)

// RefWorkers is how many experts the float64 reference computes at once:
// one per CPU, as many as refWeightBudget holds (each widens its expert's
// weights to float64, and draws them first on the cuda device), at least 1.
func RefWorkers(c Config) int {
	perWorker := 12 * 3 * float64(c.Hidden) * float64(c.FFN)
	return max(1, min(runtime.GOMAXPROCS(0), c.Experts, int(refWeightBudget/perWorker)))
}

// memPart is one part of a run's host memory, in bytes.
type memPart struct {
	Name  string
	Bytes float64
}

// memRuntime is what the process holds besides the run's data: the binary,
// the libraries it opened, Go's runtime and the goroutines' stacks.
const memRuntime = 64 << 20

// MemParts estimates the host memory a run of c holds at its peak, by part,
// when it holds its experts as mode says (Config.HostExperts, resolved).
// It counts worst cases where the routing decides (one expert may receive
// every token) only for per-expert buffers bounded by RefBlock.
func MemParts(c Config, mode string) []memPart {
	T, h, f, E, k := float64(c.Tokens), float64(c.Hidden), float64(c.FFN), float64(c.Experts), float64(c.TopK)
	ep, fs, L := float64(c.EP), float64(c.FFN*c.SharedExperts), float64(c.Experts/c.EP)
	copies := ep * T * k // token copies routed per step, all ranks
	host := c.Device == "host"
	expert := 4 * 3 * h * f // one expert's weights, or weight gradients, in float32

	// inputs, routing, logits and outputs of every rank (the cuda device's
	// host twin holds them too): x, logit override and logits, idx and
	// probs, output, shared expert's output and intermediates
	layer := ep * (4*T*h + 8*T*E + 8*T*k + 4*T*h + 4*T*h + 4*T*3*fs)
	layer += 4*E*h + 4*E + 4*3*h*fs // router weight and bias, shared expert
	var parts []memPart
	procs := float64(max(c.processes, 1))
	train := host && !c.ForwardOnly // the host's own backward buffers
	// the float64 gradient reference: the host's training step, and the
	// cuda device's where its check covers every token (else it checks no
	// gradient); a cuda dispatcher that runs forward-only is counted too
	refGrads := !c.ForwardOnly && (host || SampledTokens(c) == c.Tokens)
	if !host && !c.ForwardOnly { // the cuda device's host twin: every rank's upstream gradient (the reference takes them all)
		layer += ep * 4 * T * h
	}
	if host && mode == HostExpertsDrawn {
		parts = append(parts, memPart{"expert weights drawn on demand (float32, a group at a time)", float64(ExpertsDrawnAtOnce(c)) * expert})
	} else if host {
		parts = append(parts, memPart{"expert weights (float32)", E * expert})
		if c.IsQuantized() { // the FP8 (MX) GEMM path's e4m3 copies (fp8gemm.go, mxfp8.go)
			parts = append(parts, memPart{"expert weights (e4m3, fp8 GEMMs)", E * expert / 4})
		}
	}
	if host {
		// each rank's expert input, output and probabilities, and the
		// intermediates of its largest expert (≤ its rows); the other
		// expert workers' intermediates, a block of rows each
		layer += copies*(8*h+4+4*3*f) + float64(runtime.GOMAXPROCS(0)-1)*min(ExpertBlock, copies)*4*3*f
		// the dispatcher, and a second one for the round-trip check: the
		// permuted and received copies both ways, per-expert counts of each
		// rank, and per rank pair the chunk sizes and offsets
		disp := copies*(16*h+16) + 8*ep*E + ep*ep*(2*(24+8*L)+8)
		disp = 2*disp + copies*(8*h+4) + ep*T*(4*h+4*k) // the round trip's own ranks
		if c.Dispatcher == "hybridep" {                 // each rank's copy of the global routing map and its dense-to-expert map
			disp += ep*ep*T*E + 4*ep*T*E
		}
		if c.Dispatcher == "feplb" { // the helpers' weight copies and received rows
			domain := float64(c.Domain)
			if c.Domain == 0 {
				domain = ep
			}
			// each dynamic expert's chunks go to other ranks of its domain,
			// each chunk at least balance's MinChunk (32) copies
			chunks := min(ep*float64(c.FeplbDynamic())*(domain-1), copies/32)
			disp += chunks*4*3*h*f + copies*(4*h+4)
			if train { // and their weight gradients
				disp += chunks * 4 * 3 * h * f
			}
		}
		if train { // the backward round trip's gradients
			disp += copies*(8*h+4) + ep*T*(4*h+4*k)
		}
		parts = append(parts, memPart{"dispatchers", disp})
	}
	if train {
		// each rank's tape (fc1 outputs and activations of its copies and
		// of the shared expert), its copies' gradients (output, input,
		// probability), its tokens' (upstream, dispatcher's, router's,
		// shared expert's, the input's; probabilities, logits), and the
		// router's and shared expert's weight gradients
		back := copies*(4*3*f+8*h+4) + ep*T*(4*3*fs+24*h+4*k+4*E) + 8*E*h + 4*3*h*fs
		parts = append(parts, memPart{"backward: kept activations and gradients", back})
		if mode == HostExpertsHeld {
			parts = append(parts, memPart{"expert weight gradients (float32 main_grad)", E * expert})
		} else { // a rank's that received copies, at most
			parts = append(parts, memPart{"expert weight gradients (float32 main_grad, one rank's at a time)", min(L, copies) * expert})
		}
	}
	parts = append(parts, memPart{"layer inputs, routing and outputs", layer})
	if c.Overlaps(OverlapA2A) { // overlap.go's NewMicroBatchLayer: a layer of its own, with its own weights, buffers and dispatcher
		var mb1 float64
		for _, p := range parts {
			mb1 += p.Bytes
		}
		parts = append(parts, memPart{"the second micro-batch's layer (--overlap a2a)", mb1})
	}
	if c.Check {
		w := float64(RefWorkers(c))
		Ts := T // the tokens it computes: on the cuda device a sample
		if !host {
			Ts = float64(SampledTokens(c))
		}
		// a process of a run over several computes its own ranks' outputs
		mine := ep / procs
		ref := ep*T*k*8 + mine*Ts*(k*(24+8*h)+8*h) + 8*E*h // probabilities, copies by expert and their outputs, the output; router weight
		ref += w * (12*3*h*f + RefBlock*(8*h+8+8*3*f))     // each worker's expert weights (drawn and widened) and a block of rows
		ref += 8*3*h*fs + Ts*(16*h+8*3*fs)                 // the shared expert, one rank at a time
		parts = append(parts, memPart{"float64 reference", ref})
		if refGrads { // ReferenceGradsEach: x, dout and dx; logits and probabilities with their gradients; router weight and its gradient; shared expert and its gradients
			g := ep*T*(24*h+16*E+24*k) + 16*E*h + 8*3*2*h*fs
			g += w * (8*3*h*f*2 + 8*ep*T*h) // each worker's widened weights, its expert's weight gradients and its copies' input gradients
			if mode == HostExpertsDrawn {   // and the float32 weights it drew
				g += w * 4 * 3 * h * f
			}
			parts = append(parts, memPart{"float64 gradient reference", g})
			if procs > 1 { // GatherRouting's every rank's experts and probabilities (sent, received, copied), sumOverProcesses' rounds
				parts = append(parts, memPart{"gradient check's gathers over NCCL", 24*ep*T*k + 2*SumChunk})
			}
		}
	}
	// the router's and the reference's per-token buffers of expert scores
	// are garbage at once, but a collection cycle may still hold them
	parts = append(parts, memPart{"garbage of the router and the reference", 40 * ep * T * E})
	phases := 12.0 // at most; each kept per rank and iteration, twice for a rebalancing dispatcher
	parts = append(parts, memPart{"timings", 2 * phases * ep * float64(c.Warmup+c.Iters) * 8 * 2})
	return append(parts, memPart{"runtime", memRuntime})
}

// HostBytes is the host memory a run of c holds at its peak (estimated),
// holding its experts as c.HostExperts says (auto: as it will).
func HostBytes(c Config) int64 { return HostBytesForExpertMode(c, c.ResolvedHostExperts()) }

// HostBytes is HostBytes(c) for this process's share of a run in env (one
// of several processes, when env's launch spans them).
func (env Env) HostBytes(c Config) int64 { return HostBytes(env.Share(c)) }

// Share is c as this process's share of a run in env.
func (env Env) Share(c Config) Config {
	if env.Rendezvous != nil && c.Device != "host" {
		c.processes = env.Rendezvous.L.World
	}
	return c
}

// HostBytesForExpertMode is HostBytes with the experts held as mode says.
func HostBytesForExpertMode(c Config, mode string) int64 {
	var n float64
	for _, p := range MemParts(c, mode) {
		n += p.Bytes
	}
	return int64(1.1 * n) // Go's own overhead: span and size-class rounding, GC metadata
}

// FitsMemory says whether a run that needs need bytes may start with avail
// available: a tenth is left for the rest of the system.
func FitsMemory(need, avail float64) bool { return need <= 0.9*avail }

// MemAvailable is the memory the system can give (a variable for tests).
var MemAvailable = func() (float64, bool) { return meminfo("MemAvailable:") }
