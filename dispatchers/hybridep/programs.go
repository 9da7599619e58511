package hybridep

import (
	"fmt"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/kernels/comm"
	"github.com/moebench/moebench/kernels/device"
)

// programs are the kernels of a run (kernels/cuda/hybridep.cu, its shape
// compiled in) and their collectives.
type programs struct {
	col map[string]*device.Collective
}

// Block sizes of hybridep.cu (THREADS, PRE_THREADS, CTHREADS).
const (
	heThreads    = 128
	hePreThreads = 256
	heCThreads   = 192 // combine: 2 loader warps, 4 reducer warps (PIPES pipelines)
	hePThreads   = 128 // permute: PWARPS warps
	hePStages    = 3   // each permute warp's rows in shared memory (PSTAGES, the bulk path's), at most
	hePipes      = 2
	heOutStages  = 2 // a combine pipeline's output rows (OUT_STAGES, the bulk path's)
	fifoBudget   = 200 << 10
	// staticShared bounds each kernel's static shared memory (mbarriers,
	// the preprocessing's column words: a few KiB at most), kept out of a
	// block's opt-in limit beside its dynamic shared memory
	staticShared = 4 << 10
)

// fifoBytes is the shared memory the FIFOs may take on a device whose
// blocks may have limit bytes (its opt-in limit; 0: none known).
func fifoBytes(limit int) int {
	if limit <= 0 {
		return fifoBudget
	}
	return min(fifoBudget, limit-staticShared)
}

// preTile is the tokens of the preprocessing's tiles (PRE_TILE: at most
// 64 KiB of map rows), preTiles their count and preCols the columns of its
// scan (PRE_TILES, PRE_COLS).
func (g geom) preTile() int {
	switch {
	case g.E <= 256:
		return 256
	case g.E <= 512:
		return 128
	case g.E <= 1024:
		return 64
	}
	return 32
}
func (g geom) preTiles() int { return (g.N*g.T + g.preTile() - 1) / g.preTile() }
func (g geom) preCols() int  { return g.D + g.L + 2*g.M }

// preScratch is the ints of the preprocessing's scratch after the meta
// (META_TILECNT, META_BITS: a count and a word a warp of each column of
// each tile).
func (g geom) preScratch() int { return g.preTiles() * g.preCols() * (1 + hePreThreads/32) }

// stages is how many dispatch FIFO slots of slot bytes fit budget bytes
// of shared memory: 3 to 12, a multiple of its 3 storer warps (each slot
// has one). A storer keeps all its slots but one reading (hybridep.cu's
// S2G_INFLIGHT): up to 3 bulk-store groups each, 9 a block.
func stages(slot, budget int) int { return 3 * max(1, min(4, budget/(slot+16)/3)) }

// combineStages is each combine pipeline's FIFO slots of whole rows: what
// fits budget beside the output rows, 2 to 8 (HybridEP: 10 a block).
func combineStages(row, budget int) int {
	return max(2, min(8, (budget-hePipes*heOutStages*row)/(hePipes*(row+16))))
}

// permuteStages is each permute warp's ring of rows (PSTAGES): what fits
// budget, 1 to hePStages.
func permuteStages(row, budget int) int {
	return max(1, min(hePStages, budget/(hePThreads/32)/(row+16)))
}

// programs makes the kernels' programs for shape, each covering parts
// devices' launches, their FIFOs what fits a block's limit bytes of shared
// memory (0: none known); twins from d.
func (g geom) programs(sh dispatchers.Shape, limit int, d *Device) programs {
	row := 2 * sh.Hidden
	slot := row + 4*g.ldp()
	noBulk := "0"
	if d.noBulk {
		noBulk = "1"
	}
	budget := fifoBytes(limit)
	sd, sc, sp := stages(slot, budget), combineStages(row, budget), permuteStages(row, budget)
	defs := func(st int) map[string]string {
		return map[string]string{"MB_HE_EP": fmt.Sprint(g.N), "MB_HE_DOMAIN": fmt.Sprint(g.D), "MB_HE_TOKENS": fmt.Sprint(g.T),
			"MB_HE_EXPERTS": fmt.Sprint(g.E), "MB_HE_TOPK": fmt.Sprint(sh.TopK), "MB_HE_HIDDEN": fmt.Sprint(sh.Hidden),
			"MB_HE_CHUNK": fmt.Sprint(g.chunk), "MB_HE_STAGES": fmt.Sprint(st), "MB_NO_BULK": noBulk, "MB_HE_PSTAGES": fmt.Sprint(sp),
			// the forward dispatch's rows (packed fp8 rows at fp8)
			"MB_HE_DHIDDEN": fmt.Sprint(sh.DispatchWidth())}
	}
	permuteShared := hePThreads / 32 * comm.FIFOBytes(sp, row)
	combineShared := hePipes*comm.FIFOBytes(sc, row) + hePipes*heOutStages*row
	ps := map[string]*device.Program{
		"allgather": {File: "hybridep.cu", Kernel: "he_allgather", Block: heThreads, Defs: defs(sd), Twin: d.allgatherTwin},
		"preprocess-count": {File: "hybridep.cu", Kernel: "he_preprocess_count", Block: hePreThreads, Defs: defs(sd), Shared: g.preTile() * g.E,
			Twin: func([]device.TwinPart) error { return nil }}, // (its scratch is he_preprocess's; preprocessTwin does both)
		"preprocess": {File: "hybridep.cu", Kernel: "he_preprocess", Block: hePreThreads, Defs: defs(sd), Twin: d.preprocessTwin},
		"pack":       {File: "hybridep.cu", Kernel: "he_pack", Block: heThreads, Defs: defs(sd), Twin: d.packTwin},
		"dispatch":   {File: "hybridep.cu", Kernel: "he_dispatch", Block: heThreads, Defs: defs(sd), Shared: comm.FIFOBytes(sd, slot), Twin: d.dispatchTwin},
		"permute":    {File: "hybridep.cu", Kernel: "he_permute", Block: hePThreads, Defs: defs(sd), Shared: permuteShared, Twin: d.permuteTwin},
		"combine":    {File: "hybridep.cu", Kernel: "he_combine", Block: heCThreads, Defs: defs(sc), Shared: combineShared, Twin: d.combineTwin},
		// the backward's forms (devbackward.go)
		"pack-bwd":     {File: "hybridep.cu", Kernel: "he_pack_bwd", Block: heThreads, Defs: defs(sd), Twin: d.packBwdTwin},
		"dispatch-bwd": {File: "hybridep.cu", Kernel: "he_dispatch_bwd", Block: heThreads, Defs: defs(sd), Shared: comm.FIFOBytes(sd, slot), Twin: d.dispatchBwdTwin},
		"permute-bwd":  {File: "hybridep.cu", Kernel: "he_permute_bwd", Block: hePThreads, Defs: defs(sd), Shared: permuteShared, Twin: d.permuteBwdTwin},
		"combine-bwd":  {File: "hybridep.cu", Kernel: "he_combine_bwd", Block: heCThreads, Defs: defs(sc), Shared: combineShared, Twin: d.combineBwdTwin},
	}
	p := programs{col: map[string]*device.Collective{}}
	for k, prog := range ps {
		p.col[k] = device.NewCollective(prog, len(d.parts))
	}
	return p
}
