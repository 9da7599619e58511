package layer

import (
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/kernels/device"
	"github.com/moebench/moebench/results"
)

// Telemetry samples NVML (github.com/NVIDIA/go-nvml) while a cuda run's timed
// loop runs: every GPU's memory in use (its maximum), and of the ranks' GPU
// the SM and memory clocks and the power draw (means over the samples) and,
// where it has GPM, SM utilisation and occupancy between a GPM sample taken
// at the start and one at the end. NVML finds the ranks' GPU by its PCI
// address: NVML's GPU order need not be CUDA's. NVML missing or failing
// means "not measured", with the reason, never a failed run. MOEBENCH_NVML
// names the library.
type Telemetry struct {
	lib     nvml.Interface
	devs    []nvml.Device     // every GPU, in NVML's order
	gpu     nvml.Device       // the ranks' GPU
	gpm     [2]nvml.GpmSample // at start, at end; nil without GPM
	gpmAt   time.Time         // when the first was taken
	stop    chan struct{}
	done    sync.WaitGroup
	t       results.Telemetry
	n       int     // samples taken
	sm, mem float64 // clock sums, MHz
	power   float64 // W sum
}

// telemetryEvery is the sampling period.
const telemetryEvery = 20 * time.Millisecond

// GPMMinSpacing is the least time between GPM's two samples: NVML's header
// says the interval "should be greater than 100ms" (its counters' refresh
// rate).
const GPMMinSpacing = 100 * time.Millisecond

// StartTelemetry begins sampling, or returns nil and why it cannot. bus is
// the PCI address of the ranks' GPU (see gpuBusID); "" means unknown, and
// then NVML's GPU 0 is read, which the record says.
func StartTelemetry(bus string) (*Telemetry, string) {
	var opts []nvml.LibraryOption
	p := os.Getenv("MOEBENCH_NVML")
	if p == "" {
		p = cuda.InLibDirs("libnvidia-ml.so.1")
	}
	if p != "" {
		opts = append(opts, nvml.WithLibraryPath(p))
	}
	lib := nvml.New(opts...)
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, "NVML: " + ret.Error()
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS || n == 0 {
		lib.Shutdown()
		return nil, fmt.Sprintf("NVML reports %d GPUs (%v)", n, ret)
	}
	tm := &Telemetry{lib: lib, stop: make(chan struct{}),
		t: results.Telemetry{Method: fmt.Sprintf("NVML (go-nvml) sampled every %v during the timed loop; memory of every GPU in NVML's order, clocks and power of the ranks' GPU, its GPM metrics between samples at the loop's start and end", telemetryEvery)}}
	for i := range n {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			tm.t.Unread = append(tm.t.Unread, fmt.Sprintf("GPU %d handle: %v", i, ret))
			continue
		}
		tm.devs = append(tm.devs, d)
	}
	tm.t.MemoryUsedMax = make([]int64, len(tm.devs))
	if bus != "" {
		if d, ret := lib.DeviceGetHandleByPciBusId(bus); ret == nvml.SUCCESS {
			tm.gpu, tm.t.GPU = d, "PCI "+bus+" (the ranks' GPU, found by its PCI address)"
		} else {
			tm.t.Unread = append(tm.t.Unread, fmt.Sprintf("the ranks' GPU at PCI %s: %v; NVML's GPU 0 read instead", bus, ret))
		}
	}
	if tm.gpu == nil && len(tm.devs) > 0 {
		tm.gpu, tm.t.GPU = tm.devs[0], "NVML's GPU 0 (assumed to be the ranks' GPU: its PCI address was not known)"
	}
	tm.startGPM()
	tm.sample()
	tm.done.Add(1)
	go func() {
		defer tm.done.Done()
		tick := time.NewTicker(telemetryEvery)
		defer tick.Stop()
		for {
			select {
			case <-tm.stop:
				return
			case <-tick.C:
				tm.sample()
			}
		}
	}()
	return tm, ""
}

// startGPM takes the first GPM sample of the ranks' GPU, or notes why
// there is none.
func (tm *Telemetry) startGPM() {
	if tm.gpu == nil {
		return
	}
	sup, ret := tm.gpu.GpmQueryDeviceSupport()
	if ret != nvml.SUCCESS || sup.IsSupportedDevice == 0 {
		tm.t.Unread = append(tm.t.Unread, fmt.Sprintf("GPM (SM utilisation, occupancy): not supported on the ranks' GPU (%v)", ret))
		return
	}
	for i := range tm.gpm {
		s, ret := tm.lib.GpmSampleAlloc()
		if ret != nvml.SUCCESS {
			tm.t.Unread = append(tm.t.Unread, "GPM sample: "+ret.Error())
			tm.freeGPM()
			return
		}
		tm.gpm[i] = s
	}
	tm.gpmAt = time.Now()
	if ret := tm.lib.GpmSampleGet(tm.gpu, tm.gpm[0]); ret != nvml.SUCCESS {
		tm.t.Unread = append(tm.t.Unread, "GPM sample: "+ret.Error())
		tm.freeGPM()
	}
}

func (tm *Telemetry) freeGPM() {
	for i, s := range tm.gpm {
		if s != nil {
			s.Free()
		}
		tm.gpm[i] = nil
	}
}

// sample reads memory, clocks and power once.
func (tm *Telemetry) sample() {
	for i, d := range tm.devs {
		if m, ret := d.GetMemoryInfo(); ret == nvml.SUCCESS {
			tm.t.MemoryUsedMax[i] = max(tm.t.MemoryUsedMax[i], int64(m.Used))
		}
	}
	d := tm.gpu
	if d == nil {
		return
	}
	sm, r1 := d.GetClockInfo(nvml.CLOCK_SM)
	mem, r2 := d.GetClockInfo(nvml.CLOCK_MEM)
	mw, r3 := d.GetPowerUsage()
	if r1 == nvml.SUCCESS && r2 == nvml.SUCCESS && r3 == nvml.SUCCESS {
		tm.n++
		tm.sm += float64(sm)
		tm.mem += float64(mem)
		tm.power += float64(mw) / 1e3
	}
}

// Finish stops sampling and returns the telemetry and the SMs' measured
// utilisation for the record (or why it was not measured). A nil telemetry
// finishes with nothing.
func (tm *Telemetry) Finish() (*results.Telemetry, string) {
	if tm == nil {
		return nil, ""
	}
	close(tm.stop)
	tm.done.Wait()
	tm.sample()
	defer tm.lib.Shutdown()
	if tm.n > 0 {
		tm.t.SMClockMHz, tm.t.MemClockMHz, tm.t.PowerW = tm.sm/float64(tm.n), tm.mem/float64(tm.n), tm.power/float64(tm.n)
	} else {
		tm.t.Unread = append(tm.t.Unread, "clocks and power: NVML calls failed")
	}
	sms := "not measured: GPM unavailable (see telemetry.unread)"
	if tm.gpm[1] != nil {
		defer tm.freeGPM()
		if took := time.Since(tm.gpmAt); took <= GPMMinSpacing {
			why := fmt.Sprintf("not measured: the timed loop took %.0f ms, and NVML needs more than %v between GPM's two samples (more --iters)",
				float64(took.Microseconds())/1e3, GPMMinSpacing)
			tm.t.Unread = append(tm.t.Unread, "GPM (SM utilisation, occupancy): "+why)
			return &tm.t, why
		}
		if ret := tm.lib.GpmSampleGet(tm.gpu, tm.gpm[1]); ret != nvml.SUCCESS {
			tm.t.Unread = append(tm.t.Unread, "GPM sample: "+ret.Error())
			return &tm.t, sms
		}
		mg := nvml.GpmMetricsGetType{NumMetrics: 2, Sample1: tm.gpm[0], Sample2: tm.gpm[1]}
		mg.Metrics[0].MetricId = uint32(nvml.GPM_METRIC_SM_UTIL)
		mg.Metrics[1].MetricId = uint32(nvml.GPM_METRIC_SM_OCCUPANCY)
		if ret := tm.lib.GpmMetricsGet(&mg); ret != nvml.SUCCESS {
			tm.t.Unread = append(tm.t.Unread, "GPM metrics: "+ret.Error())
			return &tm.t, sms
		}
		for _, m := range mg.Metrics[:2] {
			if nvml.Return(m.NvmlReturn) != nvml.SUCCESS {
				tm.t.Unread = append(tm.t.Unread, fmt.Sprintf("GPM metric %d: %v", m.MetricId, nvml.Return(m.NvmlReturn)))
				return &tm.t, sms
			}
		}
		tm.t.SMUtilPct, tm.t.SMOccupancyPct = mg.Metrics[0].Value, mg.Metrics[1].Value
		tm.t.GPM = true
		sms = fmt.Sprintf("GPM over the timed loop, the ranks' whole GPU: SM utilisation %.1f%%, occupancy %.1f%%", tm.t.SMUtilPct, tm.t.SMOccupancyPct)
	}
	return &tm.t, sms
}

// GPUBusID is the PCI address of dev's GPU, for NVML to find it; "" when
// dev is not a GPU or the driver does not say.
func GPUBusID(dev device.Device) string {
	c, ok := dev.(*device.CUDA)
	if !ok {
		return ""
	}
	bus, err := c.Drv.PCIBusID(c.Ordinal)
	if err != nil {
		return ""
	}
	return bus
}
