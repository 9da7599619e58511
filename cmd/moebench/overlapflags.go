package main

import (
	"strings"

	"github.com/spf13/pflag"

	"github.com/moebench/moebench/harness/setup"
)

// addOverlapFlags defines MoE communication overlap's flags (docs/overlap.md).
func addOverlapFlags(fs *pflag.FlagSet, o *options) {
	fs.StringVar(&o.overlap, "overlap", "none", "MoE communication overlap, comma-separated: shared (the shared expert's fc1 and fc2 on a side stream while the dispatch and combine run: Megatron's moe_shared_expert_overlap) | "+
		"a2a (two micro-batches a step, the forward of one merged with the backward of the other as the combined 1F1B schedule merges them: overlap_moe_expert_parallel_comm) | none; "+
		"shared and a2a together are refused, as Megatron refuses them. The record holds the overlapped step beside the same phases run one after another, and the exposed communication (docs/overlap.md)")
	fs.Float64Var(&o.attentionMS, "attention-ms", 0, "cuda: an attention stand-in for overlap to hide behind: dense bf16 GEMMs [tokens, hidden]×[hidden, hidden] before the forward and after the backward, as many as take about this many ms a pass on the device (calibrated); their outputs are read by nothing; 0 = none")
	fs.BoolVar(&o.delayWgrad, "delay-wgrad", false, "defer the expert GEMMs' weight gradients onto a stream of their own, after their dgrad, beside the dispatcher's backward communication (Megatron's delay_wgrad_compute); a training step's")
}

// overlapAxis is sweep's --overlap: a list of settings, each a point (a
// sweep file may give it as a JSON list).
type overlapAxis struct{ v *string }

func (a overlapAxis) Set(s string) error { *a.v = s; return nil }
func (a overlapAxis) String() string     { return *a.v }
func (overlapAxis) Type() string         { return "stringSlice" }

// overlapAxisFlag makes fs's --overlap sweep's axis.
func overlapAxisFlag(fs *pflag.FlagSet, o *options) {
	fl := fs.Lookup("overlap")
	fl.Value = overlapAxis{&o.overlap}
	fl.Usage = "MoE communication overlap settings, comma-separated, each a point of the sweep: none | shared | a2a (see moebench run --help and docs/overlap.md; --delay-wgrad and --attention-ms apply to every point)"
}

// overlapPoints are the sweep's overlap settings.
func overlapPoints(s string) []string {
	if s == "" {
		return []string{"none"}
	}
	return strings.Split(s, ",")
}

// Why the bench commands have no overlap axis: each times one part alone,
// and overlap needs the step's communication beside its compute.
const (
	benchKernelsNoOverlap  = "bench kernels times each kernel alone on one stream: there is no communication to hide"
	benchDispatchNoOverlap = "bench dispatch times the dispatcher's dispatch and combine alone, a round trip with no expert GEMMs, no backward and no second micro-batch: there is no compute to hide the communication behind"
)

// noOverlapFlag gives a bench with nothing to overlap an --overlap that
// takes none only (checkNoOverlap), so that the flag is refused with why.
func noOverlapFlag(fs *pflag.FlagSet, o *options, why string) {
	fs.StringVar(&o.overlap, "overlap", "none", "none only: "+why+"; overlap is measured by moebench run and sweep's --overlap (docs/overlap.md)")
}

// checkNoOverlap refuses --overlap other than none where why says there is
// nothing to overlap.
func checkNoOverlap(o *options, why string) error {
	if o.overlap == "" || o.overlap == "none" {
		return nil
	}
	return &setup.ConfigError{Flag: "overlap", Value: o.overlap, Allowed: "allowed: none only: " + why + "; measure overlap with moebench run or sweep --overlap (docs/overlap.md)"}
}
