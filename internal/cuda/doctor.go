package cuda

import (
	"fmt"
	"strings"
)

// Component is one library or device moebench can use, as found here.
type Component struct {
	Name    string
	Found   bool
	Path    string // as loaded: a file, or a name resolved by the loader's path
	Version string
	Detail  string // what it offers, or why it is missing
}

// Doctor probes every CUDA library moebench uses and the GPUs; nothing it
// finds missing is an error: it says why.
func Doctor() []Component {
	var out []Component
	drv, gpus, err := Probe()
	c := Component{Name: "driver (libcuda)"}
	switch {
	case err != nil:
		c.Detail = err.Error()
	default:
		c.Found, c.Version = true, fmt.Sprintf("CUDA %d.%d", drv/1000, drv%1000/10)
		c.Detail = fmt.Sprintf("%d GPU(s)", len(gpus))
		for _, g := range gpus {
			c.Detail += fmt.Sprintf("; %d: %s", g.Ordinal, g.Name)
		}
	}
	out = append(out, c)

	c = Component{Name: "NVRTC"}
	if n, err := OpenNVRTC(); err != nil {
		c.Detail = err.Error()
	} else {
		c.Found, c.Path, c.Version, c.Detail = true, n.Path, fmt.Sprintf("%d.%d", n.Major, n.Minor), "compiles the kernels"
	}
	out = append(out, c)

	c = Component{Name: "cuBLASLt"}
	if b, err := OpenCuBLASLt(); err != nil {
		c.Detail = err.Error()
	} else {
		c.Found, c.Path, c.Version, c.Detail = true, b.Path, fmt.Sprint(b.Version), "expert and router GEMMs"
	}
	out = append(out, c)

	c = Component{Name: "cuBLAS"}
	if b, err := OpenCuBLAS(); err != nil {
		c.Detail = err.Error()
	} else {
		c.Found, c.Path, c.Detail = true, b.Path, "cublasGemmGroupedBatchedEx, compared with per-expert cuBLASLt calls"
	}
	out = append(out, c, probeNCCL(), probeNCCLEP())

	return append(out, probeNVML())
}

// probeNCCL loads NCCL and reads its version.
func probeNCCL() Component {
	c := Component{Name: "NCCL"}
	n, err := OpenNCCL()
	if err != nil {
		c.Detail = err.Error()
		return c
	}
	c.Found, c.Path, c.Version, c.Detail = true, n.Path, n.Version, "alltoall --impl library: grouped send/recv between GPUs, one rank per GPU, in one process or across processes"
	return c
}

// probeNCCLEP loads NCCL EP (over NCCL), asks its version, and says
// whether what it needs at run time is here: NCCL's Device API and what
// its run-time compile uses (a CUDA 13 driver and an sm_90 GPU are checked
// when a run opens them).
func probeNCCLEP() Component {
	c := Component{Name: "NCCL EP"}
	e, err := OpenNCCLEP()
	if err != nil {
		c.Detail = err.Error() + "; install: pip install nccl-extensions[cu13] (docs/dispatchers/ncclep.md)"
		return c
	}
	c.Found, c.Path, c.Version = true, e.Path, e.Version
	c.Detail = "hybridep --impl library (its high-throughput mode), deepep-ll --impl library (its low-latency mode), " +
		"in one process or across processes (one per node or per GPU, each creating its ranks' groups over the run's NCCL communicator; " +
		"at most 8 ranks per node, 64 in all); " +
		fmt.Sprintf("release %s (ncclEpGetVersion; the library states no API version): the append-only API of nccl_ep.h's version %d "+
			"(it has ncclEpInitHandle and ncclEpUpdateHandle), so moebench sends its structs at their frozen V%d sizes, which it accepts; over NCCL %s",
			e.Version, EPAPIVersion, EPStructVersion, e.NCCL.Version)
	var missing []string
	if ok, why := e.NCCL.DeviceAPI(); !ok {
		missing = append(missing, why)
	}
	rt := FindEPRuntime(e)
	missing = append(missing, rt.Missing...)
	if missing == nil {
		c.Detail += fmt.Sprintf("; NCCL's Device API and its run-time compile's needs found (nvcc %s, headers %s, %s, %s)", rt.NVCC, rt.Source, rt.NCCLInclude, rt.CUDAInclude)
	} else {
		c.Detail += "; missing: " + strings.Join(missing, "; ")
	}
	return c
}
