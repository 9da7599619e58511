package setup

// MaxAttentionMS bounds --attention-ms.
const MaxAttentionMS = 10_000

// Overlap forms (Config.Overlap).
const (
	OverlapShared = "shared"
	OverlapA2A    = "a2a"
)

// OverlapForms are the values --overlap takes.
var OverlapForms = []string{OverlapShared, OverlapA2A}

// SharedA2AConflict is why shared and a2a are refused together: Megatron's
// guidance.
const SharedA2AConflict = "Megatron-Core refuses moe_shared_expert_overlap with overlap_moe_expert_parallel_comm: the shared expert's side stream conflicts with the dispatch overlap, which already hides the dispatch and combine behind the other micro-batch's compute (use one or the other)"
