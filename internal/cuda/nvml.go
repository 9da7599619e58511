package cuda

// NVML (libnvidia-ml.so.1) through dlopen: the driver version, the power
// limit and the active NVLinks. Telemetry proper (memory, clocks, GPM) goes
// through go-nvml.

/*
#cgo CFLAGS: -I${SRCDIR}/abi
#include <stdlib.h>
#include "abi.h"
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
	if st := C.mbcall_nvmlInit_v2(syms["nvmlInit_v2"]); st != 0 {
		c.Detail = fmt.Sprintf("nvmlInit_v2: NVML error %d", int(st))
		return c
	}
	defer C.mbcall_nvmlShutdown(syms["nvmlShutdown"])
	buf := make([]byte, 96)
	if st := C.mbcall_nvmlSystemGetDriverVersion(syms["nvmlSystemGetDriverVersion"], (*C.char)(unsafe.Pointer(&buf[0])), C.uint(len(buf))); st != 0 {
		c.Detail = fmt.Sprintf("nvmlSystemGetDriverVersion: NVML error %d", int(st))
		return c
	}
	c.Found, c.Path, c.Version = true, lib.path, C.GoString((*C.char)(unsafe.Pointer(&buf[0])))
	c.Detail = "telemetry: memory, clocks, power"
	return c
}

// withNVML initializes NVML, resolves the entry points names (besides
// init, shutdown and the PCI lookup) and calls fn with them and a lookup of
// a GPU's handle by its PCI address; NVML is shut down after.
func withNVML(names []string, fn func(sym map[string]unsafe.Pointer, byBus func(bus string) (unsafe.Pointer, error)) error) error {
	lib, err := openLibrary("MOEBENCH_NVML", "libnvidia-ml.so.1")
	if err != nil {
		return err
	}
	sym := map[string]unsafe.Pointer{}
	for _, n := range append([]string{"nvmlInit_v2", "nvmlShutdown", "nvmlDeviceGetHandleByPciBusId_v2"}, names...) {
		if sym[n], err = lib.sym(n); err != nil {
			return err
		}
	}
	if st := C.mbcall_nvmlInit_v2(sym["nvmlInit_v2"]); st != 0 {
		return fmt.Errorf("nvmlInit_v2: NVML error %d", int(st))
	}
	defer C.mbcall_nvmlShutdown(sym["nvmlShutdown"])
	return fn(sym, func(bus string) (unsafe.Pointer, error) {
		var dev unsafe.Pointer
		cbus := C.CString(bus)
		defer C.free(unsafe.Pointer(cbus))
		if st := C.mbcall_nvmlDeviceGetHandleByPciBusId_v2(sym["nvmlDeviceGetHandleByPciBusId_v2"], cbus, &dev); st != 0 {
			return nil, fmt.Errorf("nvmlDeviceGetHandleByPciBusId_v2(%s): NVML error %d", bus, int(st))
		}
		return dev, nil
	})
}

// readPowerLimit reads the power limit of the GPU at PCI address bus
// through NVML.
func readPowerLimit(g *GPUInfo, bus string) error {
	return withNVML([]string{"nvmlDeviceGetPowerManagementLimit"}, func(sym map[string]unsafe.Pointer, byBus func(string) (unsafe.Pointer, error)) error {
		dev, err := byBus(bus)
		if err != nil {
			return err
		}
		var mw C.uint
		if st := C.mbcall_nvmlDeviceGetPowerManagementLimit(sym["nvmlDeviceGetPowerManagementLimit"], dev, &mw); st != 0 {
			return fmt.Errorf("nvmlDeviceGetPowerManagementLimit: NVML error %d", int(st))
		}
		g.PowerLimitW = float64(mw) / 1000
		return nil
	})
}

// nvlinkMax is NVML_NVLINK_MAX_LINKS: the most NVLinks NVML numbers.
const nvlinkMax = 18

// readNVLinks counts the active NVLinks of the GPU at each PCI address
// (nvmlDeviceGetNvLinkState over the link numbers; a GPU without NVLink
// has none).
func readNVLinks(buses []string) ([]int, error) {
	links := make([]int, len(buses))
	err := withNVML([]string{"nvmlDeviceGetNvLinkState"}, func(sym map[string]unsafe.Pointer, byBus func(string) (unsafe.Pointer, error)) error {
		for i, bus := range buses {
			dev, err := byBus(bus)
			if err != nil {
				return err
			}
			for l := range nvlinkMax {
				var on C.uint
				st := C.mbcall_nvmlDeviceGetNvLinkState(sym["nvmlDeviceGetNvLinkState"], dev, C.uint(l), &on)
				if st == nvmlErrorInvalidArgument || st == nvmlErrorNotSupported { // past the GPU's links, or none
					break
				}
				if st != 0 {
					return fmt.Errorf("nvmlDeviceGetNvLinkState(%s, link %d): NVML error %d", bus, l, int(st))
				}
				if on == nvmlFeatureEnabled {
					links[i]++
				}
			}
		}
		return nil
	})
	return links, err
}

// NVML return codes the NVLink query tells apart, and a link's state.
const (
	nvmlErrorInvalidArgument = 2
	nvmlErrorNotSupported    = 3
	nvmlFeatureEnabled       = 1
)
