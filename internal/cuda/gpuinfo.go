package cuda

import (
	"fmt"
	"strings"
)

// GPUInfo is the GPU side of a stack fingerprint.
type GPUInfo struct {
	Model                   string
	Count, SMs              int
	CopyEngines             int
	MemoryBytes             int64
	CUDADriver              int
	Driver                  string // kernel driver version (NVML)
	SMClockMHz, MemClockMHz int
	PowerLimitW             float64 // of GPU 0 (NVML, found by its PCI address)
	Topology                string  // peer access between every pair, and each GPU's active NVLinks
	NVRTC, CuBLASLt, NCCL   string
	NCCLEP                  string
	Unread                  []string // what could not be read, and why
}

// ReadGPUInfo reads the fingerprint of GPU 0 and the node's GPU count,
// libraries and topology (peer access, NVLinks). Only a missing driver is an error; anything
// else missing is listed in Unread.
func ReadGPUInfo() (GPUInfo, error) {
	var g GPUInfo
	d, err := OpenDriver()
	if err != nil {
		return g, err
	}
	if g.CUDADriver, err = d.Version(); err != nil {
		return g, err
	}
	if g.Count, err = d.DeviceCount(); err != nil {
		return g, err
	}
	if g.Count == 0 {
		return g, fmt.Errorf("the CUDA driver reports no GPU")
	}
	if g.Model, err = d.Name(0); err != nil {
		g.Unread = append(g.Unread, "model: "+err.Error())
	}
	attr := func(a int, what string) int {
		v, err := d.Attribute(0, a)
		if err != nil {
			g.Unread = append(g.Unread, what+": "+err.Error())
		}
		return v
	}
	g.SMs = attr(AttrMultiprocessorCount, "SM count")
	g.CopyEngines = attr(AttrAsyncEngineCount, "copy engines")
	g.SMClockMHz = attr(AttrClockRateKHz, "SM clock") / 1000
	g.MemClockMHz = attr(AttrMemoryClockRateKHz, "memory clock") / 1000
	if g.MemoryBytes, err = d.TotalMem(0); err != nil {
		g.Unread = append(g.Unread, "memory: "+err.Error())
	}
	var pairs []string
	for a := range g.Count {
		for b := range g.Count {
			if a == b {
				continue
			}
			ok, err := d.CanAccessPeer(a, b)
			switch {
			case err != nil:
				pairs = append(pairs, fmt.Sprintf("%d→%d ?", a, b))
			case ok:
				pairs = append(pairs, fmt.Sprintf("%d→%d p2p", a, b))
			default:
				pairs = append(pairs, fmt.Sprintf("%d→%d none", a, b))
			}
		}
	}
	g.Topology = strings.Join(pairs, ", ")
	if g.Topology == "" {
		g.Topology = "single GPU"
	}
	if nv, err := nvlinks(d, g.Count); err != nil {
		g.Unread = append(g.Unread, "NVLink (NVML): "+err.Error())
	} else {
		g.Topology += "; " + nv
	}
	for _, c := range Doctor() {
		switch c.Name {
		case "NVRTC":
			g.NVRTC = versionOr(c)
		case "cuBLASLt":
			g.CuBLASLt = versionOr(c)
		case "NCCL":
			g.NCCL = versionOr(c)
		case "NCCL EP":
			g.NCCLEP = versionOr(c)
		case "NVML":
			if c.Found {
				g.Driver = c.Version
			}
		}
	}
	bus, err := d.PCIBusID(0)
	if err == nil {
		err = readPowerLimit(&g, bus)
	}
	if err != nil {
		g.Unread = append(g.Unread, "power limit (NVML): "+err.Error())
	}
	return g, nil
}

// nvlinks says how many NVLinks of each of count GPUs are active (found in
// NVML by the GPUs' PCI addresses).
func nvlinks(d *Driver, count int) (string, error) {
	buses := make([]string, count)
	for i := range buses {
		var err error
		if buses[i], err = d.PCIBusID(i); err != nil {
			return "", err
		}
	}
	links, err := readNVLinks(buses)
	if err != nil {
		return "", err
	}
	var parts []string
	total := 0
	for i, n := range links {
		parts = append(parts, fmt.Sprintf("GPU %d %d", i, n))
		total += n
	}
	if total == 0 {
		return "no active NVLink", nil
	}
	return "active NVLinks: " + strings.Join(parts, ", "), nil
}

func versionOr(c Component) string {
	if c.Found {
		return c.Version
	}
	return "missing"
}
