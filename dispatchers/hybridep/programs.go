package hybridep

import (
	"fmt"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/kernels"
)

// programs are the kernels of a run (kernels/cuda/hybridep.cu, its shape
// compiled in) and their collectives.
type programs struct {
	col map[string]*kernels.Collective
}

// Block sizes of hybridep.cu (THREADS, PRE_THREADS).
const (
	heThreads    = 128
	hePreThreads = 256
	heColBytes   = 2048 // COLS: the bytes of a row a combine FIFO item holds
	fifoBudget   = 200 << 10
)

// stages is how many FIFO slots of slot bytes fit the shared-memory budget:
// 3 to 12, a multiple of the kernels' 3 consumer warps (each slot has one).
// A dispatch storer keeps all its slots but one reading (hybridep.cu's
// S2G_INFLIGHT): up to 3 bulk-store groups each, 9 a block.
func stages(slot int) int { return 3 * max(1, min(4, fifoBudget/(slot+16)/3)) }

// programs makes the kernels' programs for shape, each covering parts
// devices' launches; twins from d.
func (g geom) programs(sh dispatchers.Shape, blocks int, d *Device) programs {
	row := 2 * sh.Hidden
	slot := row + 4*g.ldp()
	chunk := min(row, heColBytes)
	defs := func(st int) map[string]string {
		return map[string]string{"MB_HE_EP": fmt.Sprint(g.N), "MB_HE_DOMAIN": fmt.Sprint(g.D), "MB_HE_TOKENS": fmt.Sprint(g.T),
			"MB_HE_EXPERTS": fmt.Sprint(g.E), "MB_HE_TOPK": fmt.Sprint(sh.TopK), "MB_HE_HIDDEN": fmt.Sprint(sh.Hidden),
			"MB_HE_CHUNK": fmt.Sprint(g.chunk), "MB_HE_STAGES": fmt.Sprint(st), "MB_NO_BULK": "0"}
	}
	sd, sc := stages(slot), stages(chunk)
	ps := map[string]*kernels.Program{
		"allgather":  {File: "hybridep.cu", Kernel: "he_allgather", Block: heThreads, Defs: defs(sd), Twin: d.allgatherTwin},
		"preprocess": {File: "hybridep.cu", Kernel: "he_preprocess", Block: hePreThreads, Defs: defs(sd), Twin: d.preprocessTwin},
		"pack":       {File: "hybridep.cu", Kernel: "he_pack", Block: heThreads, Defs: defs(sd), Twin: d.packTwin},
		"dispatch":   {File: "hybridep.cu", Kernel: "he_dispatch", Block: heThreads, Defs: defs(sd), Shared: kernels.FIFOBytes(sd, slot), Twin: d.dispatchTwin},
		"combine":    {File: "hybridep.cu", Kernel: "he_combine", Block: heThreads, Defs: defs(sc), Shared: kernels.FIFOBytes(sc, chunk), Twin: d.combineTwin},
		// the backward's forms (devbackward.go)
		"pack-bwd":     {File: "hybridep.cu", Kernel: "he_pack_bwd", Block: heThreads, Defs: defs(sd), Twin: d.packBwdTwin},
		"dispatch-bwd": {File: "hybridep.cu", Kernel: "he_dispatch_bwd", Block: heThreads, Defs: defs(sd), Shared: kernels.FIFOBytes(sd, slot), Twin: d.dispatchBwdTwin},
		"combine-bwd":  {File: "hybridep.cu", Kernel: "he_combine_bwd", Block: heThreads, Defs: defs(sc), Shared: kernels.FIFOBytes(sc, chunk), Twin: d.combineBwdTwin},
	}
	p := programs{col: map[string]*kernels.Collective{}}
	for k, prog := range ps {
		p.col[k] = kernels.NewCollective(prog, len(d.parts))
	}
	return p
}
