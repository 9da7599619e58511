package comm

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strings"
)

// The throughput model read from the machine code (issue 32). The SASS
// audit (inflight_test.go) reads the sm_90 cubins of deepep.cu and
// hybridep.cu, finds each data-moving loop, counts the 16-byte global
// loads a lane keeps in flight there (issued and not yet consumed) and the
// bulk-copy bytes a block's FIFO keeps in flight, and writes the result to
// inflight.json, which CI regenerates and requires to be current. Little's
// law turns bytes in flight per SM into a ceiling: GB/s per SM = bytes in
// flight per SM ÷ the memory's latency (bytes per ns = GB/s). It is a
// prediction from the machine code, never a measurement: an upper bound
// that ignores everything but latency (link and HBM bandwidth, the stores'
// path, waits between ranks).

// Load latencies the model divides by, in ns, with their sources.
const (
	// LatencyHBM: a global load that misses L2, Hopper. GH200 (H100 die,
	// HBM3): 690 cycles by pointer chasing (markdewing/AI_kernels,
	// latency/README.md, "All measurements are in clock cycles"), at the
	// H100 SXM's 1.98 GHz boost clock: 690 / 1.98 ≈ 348 ns.
	LatencyHBM = 348.0
	// LatencyNVLink: a load of a peer GPU's memory over NVLink. No
	// published microbenchmark of a Hopper peer load was found in the
	// sources this project holds; 1 µs is the planning figure of
	// docs/references.md (DeepEP and HybridEP). Replace it with
	// a measurement when one is published or taken.
	LatencyNVLink = 1000.0
)

// LatencySources cites each latency (printed with the table).
var LatencySources = map[string]string{
	"hbm":    "GH200 (H100 die, HBM3) main-memory load, 690 cycles by pointer chasing (github.com/markdewing/AI_kernels latency/README.md) at 1.98 GHz ≈ 348 ns",
	"nvlink": "planning figure of about 1 µs for a peer access over NVLink (docs/references.md); no published Hopper microbenchmark found: unverified",
}

// Targets of the audit: a row-copy loop keeps at least InflightLoadsTarget
// 16-byte loads in flight per lane, a bulk-copy path at least
// InflightBulkTarget bytes per SM.
const (
	InflightLoadsTarget = 4
	InflightBulkTarget  = 32 << 10
)

// InflightLoop is one data-moving loop of a kernel: its 16-byte global
// loads in flight per lane, the warps of a block that run it and the
// resulting bytes in flight per SM (one block per SM), and the ceiling.
type InflightLoop struct {
	At           string  `json:"at"`             // its SASS addresses, e.g. "0x22e0-0x2560"
	Into         string  `json:"into"`           // where the loaded rows go: global (or a peer) or shared (a FIFO)
	LoadsPerLane int     `json:"loads_per_lane"` // 16-byte loads issued and not yet consumed, at most
	Warps        int     `json:"warps"`          // warps of a block that run it
	BytesPerSM   int     `json:"bytes_per_sm"`
	Memory       string  `json:"memory"` // hbm or nvlink: what its loads read
	GBpsPerSM    float64 `json:"gbps_per_sm"`
	// TailOf: the unrolled loop (its addresses) whose left-over
	// iterations this loop runs; it is neither checked nor in the ceiling
	TailOf string `json:"tail_of,omitempty"`
	// Unread: instructions of its body the disassembler printed no text
	// for (skipped by the analysis)
	Unread int `json:"unread,omitempty"`
}

// InflightKernel is one kernel on one path (16-byte or bulk).
type InflightKernel struct {
	Kernel string `json:"kernel"`
	Path   string `json:"path"` // "16-byte" or "bulk"
	// Share: the fraction of the kernel's SMs that move each row through
	// a loop (deepep: ½, even blocks send and odd ones receive)
	Share float64        `json:"share"`
	Loops []InflightLoop `json:"loops,omitempty"`
	// the bulk path: bytes of one FIFO item (its bulk copies, from the
	// SASS), the FIFO's stages (the compile's constant) and their product
	// per SM; the memory the copies read
	BulkItemBytes  int     `json:"bulk_item_bytes,omitempty"`
	BulkItemFrom   string  `json:"bulk_item_from,omitempty"` // where the item's bytes were read
	BulkStages     int     `json:"bulk_stages,omitempty"`
	BulkBytesPerSM int     `json:"bulk_bytes_per_sm,omitempty"`
	BulkMemory     string  `json:"bulk_memory,omitempty"`
	BulkGBpsPerSM  float64 `json:"bulk_gbps_per_sm,omitempty"`
	// Ceiling: the least of its loops' (and bulk copies') GB/s per SM × Share
	CeilingGBpsPerSM float64 `json:"ceiling_gbps_per_sm"`
	// BelowTarget: why it misses the targets, if it does
	BelowTarget string `json:"below_target,omitempty"`
}

// InflightTable is inflight.json.
type InflightTable struct {
	Note      string             `json:"note"`
	Source    string             `json:"source"` // the cubins it was read from
	LatencyNs map[string]float64 `json:"latency_ns"`
	Latency   map[string]string  `json:"latency_sources"`
	Kernels   []InflightKernel   `json:"kernels"`
}

//go:embed inflight.json
var inflightJSON []byte

// Inflight returns the committed table (inflight.json, embedded).
func Inflight() (*InflightTable, error) {
	var t InflightTable
	if err := json.Unmarshal(inflightJSON, &t); err != nil {
		return nil, fmt.Errorf("kernels/comm/inflight.json: %v", err)
	}
	return &t, nil
}

// Kernel returns the row of kernel on path.
func (t *InflightTable) Kernel(kernel, path string) (InflightKernel, bool) {
	for _, k := range t.Kernels {
		if k.Kernel == kernel && k.Path == path {
			return k, true
		}
	}
	return InflightKernel{}, false
}

// littleGBps is Little's law: bytes in flight ÷ latency in ns = GB/s,
// rounded to 0.1.
func littleGBps(bytes int, latencyNs float64) float64 {
	return math.Round(float64(bytes)/latencyNs*10) / 10
}

// latencyOf returns the latency of a memory class.
func latencyOf(memory string) float64 {
	if memory == "nvlink" {
		return LatencyNVLink
	}
	return LatencyHBM
}

// finish computes k's bytes per SM, GB/s and ceiling from its counts, and
// whether it misses the targets.
func (k *InflightKernel) finish() {
	k.CeilingGBpsPerSM = 0
	var below []string
	ceiling := math.Inf(1)
	for i := range k.Loops {
		l := &k.Loops[i]
		l.BytesPerSM = l.LoadsPerLane * 16 * 32 * l.Warps
		l.GBpsPerSM = littleGBps(l.BytesPerSM, latencyOf(l.Memory))
		if l.TailOf != "" {
			continue
		}
		ceiling = min(ceiling, l.GBpsPerSM*k.Share)
		if l.LoadsPerLane < InflightLoadsTarget {
			below = append(below, fmt.Sprintf("loop %s keeps %d 16-byte load(s) in flight per lane (target %d)", l.At, l.LoadsPerLane, InflightLoadsTarget))
		}
	}
	if strings.HasPrefix(k.Path, "bulk") {
		k.BulkBytesPerSM = k.BulkItemBytes * k.BulkStages
		k.BulkGBpsPerSM = littleGBps(k.BulkBytesPerSM, latencyOf(k.BulkMemory))
		ceiling = min(ceiling, k.BulkGBpsPerSM*k.Share)
		if k.BulkBytesPerSM < InflightBulkTarget {
			below = append(below, fmt.Sprintf("its bulk copies keep %d B in flight per SM (%d stages × %d B; target %d)", k.BulkBytesPerSM, k.BulkStages, k.BulkItemBytes, InflightBulkTarget))
		}
	}
	if !math.IsInf(ceiling, 1) {
		k.CeilingGBpsPerSM = math.Round(ceiling*10) / 10
	}
	k.BelowTarget = strings.Join(below, "; ")
}

// sortKernels orders the table's rows.
func (t *InflightTable) sortKernels() {
	sort.Slice(t.Kernels, func(i, j int) bool {
		a, b := t.Kernels[i], t.Kernels[j]
		if a.Kernel != b.Kernel {
			return a.Kernel < b.Kernel
		}
		return a.Path < b.Path
	})
}

// DispatcherKernels names the kernels of a dispatcher's dispatch and
// combine that the cuda device runs on sm_90 with NVRTC ≥ 12 (hybridep's
// bulk path), and their path; ok is false for a dispatcher without
// SM-driven kernels in the table.
func DispatcherKernels(dispatcher string) (dispatch, combine, path string, ok bool) {
	switch dispatcher {
	case "deepep":
		return "deepep_dispatch", "deepep_combine", "16-byte", true
	case "hybridep":
		return "he_dispatch", "he_combine", "bulk", true
	}
	return "", "", "", false
}
