package cuda

// NVML (libnvidia-ml.so.1) through dlopen: the driver version and the power
// limit. Telemetry proper (memory, clocks, GPM) is to go through go-nvml.

/*
#include <stdlib.h>
typedef int (*n_void)(void);
typedef int (*n_str)(char *, unsigned int);
typedef int (*n_limit)(void *, unsigned int *);
typedef int (*n_bus)(const char *, void **);
static int call_void(void *f) { return ((n_void)f)(); }
static int call_str(void *f, char *s, unsigned int n) { return ((n_str)f)(s, n); }
static int call_nlimit(void *f, void *d, unsigned int *mw) { return ((n_limit)f)(d, mw); }
static int call_nbus(void *f, const char *bus, void **d) { return ((n_bus)f)(bus, d); }
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// probeNVML loads NVML and reads the driver version (nvmlInit_v2,
// nvmlSystemGetDriverVersion, nvmlShutdown).
func probeNVML() Component {
	c := Component{Name: "NVML"}
	lib, err := openLibrary("MOEBENCH_NVML", "libnvidia-ml.so.1")
	if err != nil {
		c.Detail = err.Error() + "; telemetry would say \"not measured\""
		return c
	}
	syms := map[string]unsafe.Pointer{}
	for _, n := range []string{"nvmlInit_v2", "nvmlSystemGetDriverVersion", "nvmlShutdown"} {
		if syms[n], err = lib.sym(n); err != nil {
			c.Detail = err.Error()
			return c
		}
	}
	if st := C.call_void(syms["nvmlInit_v2"]); st != 0 {
		c.Detail = fmt.Sprintf("nvmlInit_v2: NVML error %d", int(st))
		return c
	}
	defer C.call_void(syms["nvmlShutdown"])
	buf := make([]byte, 96)
	if st := C.call_str(syms["nvmlSystemGetDriverVersion"], (*C.char)(unsafe.Pointer(&buf[0])), C.uint(len(buf))); st != 0 {
		c.Detail = fmt.Sprintf("nvmlSystemGetDriverVersion: NVML error %d", int(st))
		return c
	}
	c.Found, c.Path, c.Version = true, lib.path, C.GoString((*C.char)(unsafe.Pointer(&buf[0])))
	c.Detail = "telemetry: memory, clocks, power"
	return c
}

// readPowerLimit reads the power limit of the GPU at PCI address bus
// through NVML.
func readPowerLimit(g *GPUInfo, bus string) error {
	lib, err := openLibrary("MOEBENCH_NVML", "libnvidia-ml.so.1")
	if err != nil {
		return err
	}
	fn := map[string]unsafe.Pointer{}
	for _, n := range []string{"nvmlInit_v2", "nvmlShutdown", "nvmlDeviceGetHandleByPciBusId_v2", "nvmlDeviceGetPowerManagementLimit"} {
		if fn[n], err = lib.sym(n); err != nil {
			return err
		}
	}
	if st := C.call_void(fn["nvmlInit_v2"]); st != 0 {
		return fmt.Errorf("nvmlInit_v2: NVML error %d", int(st))
	}
	defer C.call_void(fn["nvmlShutdown"])
	var dev unsafe.Pointer
	cbus := C.CString(bus)
	defer C.free(unsafe.Pointer(cbus))
	if st := C.call_nbus(fn["nvmlDeviceGetHandleByPciBusId_v2"], cbus, &dev); st != 0 {
		return fmt.Errorf("nvmlDeviceGetHandleByPciBusId_v2(%s): NVML error %d", bus, int(st))
	}
	var mw C.uint
	if st := C.call_nlimit(fn["nvmlDeviceGetPowerManagementLimit"], dev, &mw); st != 0 {
		return fmt.Errorf("nvmlDeviceGetPowerManagementLimit: NVML error %d", int(st))
	}
	g.PowerLimitW = float64(mw) / 1000
	return nil
}
