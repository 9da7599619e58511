package results

// Overlap is what a run with MoE communication overlap (--overlap,
// --delay-wgrad) measured: the overlapped step beside the same step's
// phases run one after another, interleaved in the same invocation, and
// the communication the overlap left exposed. See docs/overlap.md.
type Overlap struct {
	// Forms: "shared", "a2a" (comma-separated, as --overlap); DelayWgrad:
	// --delay-wgrad; MicroBatches: micro-batches a step (2 with a2a).
	Forms        string `json:"forms,omitempty"`
	DelayWgrad   bool   `json:"delay_wgrad,omitempty"`
	MicroBatches int    `json:"micro_batches"`
	// Step is the overlapped step (slowest rank, from the common start to
	// its end); Sequential the same phases one after another; Ratio is
	// Sequential's p50 over Step's.
	Step       *Stat   `json:"step_ms,omitempty"`
	Sequential *Stat   `json:"sequential_step_ms,omitempty"`
	Ratio      float64 `json:"ratio,omitempty"`
	// Comm is the dispatcher's phases' busy time in the overlapped step
	// (the union of their intervals, slowest rank); Exposed the part of it
	// no compute on another stream covered; SequentialExposed the same in
	// the sequential step (all of its communication).
	Comm              *Stat `json:"comm_ms,omitempty"`
	Exposed           *Stat `json:"exposed_comm_ms,omitempty"`
	SequentialExposed *Stat `json:"sequential_exposed_comm_ms,omitempty"`
	// GEMMSMs is how many SMs the GEMMs had beside the dispatcher's
	// kernels (the device's, less the SMs they hold); GEMMSMsNote says how
	// it was counted.
	GEMMSMs     int    `json:"gemm_sms,omitempty"`
	GEMMSMsNote string `json:"gemm_sms_note,omitempty"`
	// Equal says whether the overlapped step's output and every gradient
	// equal the sequential step's, bit for bit.
	Equal bool   `json:"equal"`
	Note  string `json:"note,omitempty"`
}
