package cuda

// NVML (libnvidia-ml.so.1) through go-nvml (github.com/NVIDIA/go-nvml),
// moebench's one NVML binding: here the driver version, the power limit and
// the active NVLinks; telemetry proper (memory, clocks, GPM) is the
// harness's, through go-nvml too.

import (
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// nvmlMissing is NVML not loading (as against failing once loaded).
type nvmlMissing struct{ error }

// withNVML finds libnvidia-ml.so.1 as every CUDA library is found
// (MOEBENCH_NVML, the --cuda-libs folders, the loader's path, the usual
// folders: openLibrary, whose error says what was tried; an nvmlMissing), checks that it has the entry points names besides
// nvmlInit_v2 and nvmlShutdown (go-nvml binds them lazily: a missing one
// would abort the process when called), initializes it through go-nvml and
// calls fn with it and the path it was loaded from; NVML is shut down after.
func withNVML(names []string, fn func(lib nvml.Interface, path string) error) error {
	l, err := openLibrary("MOEBENCH_NVML", "libnvidia-ml.so.1")
	if err != nil {
		return nvmlMissing{err}
	}
	for _, n := range append([]string{"nvmlInit_v2", "nvmlShutdown"}, names...) {
		if _, err := l.sym(n); err != nil {
			return err
		}
	}
	lib := nvml.New(nvml.WithLibraryPath(l.path))
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return fmt.Errorf("nvmlInit_v2: NVML error %d", int(ret))
	}
	defer lib.Shutdown()
	return fn(lib, l.path)
}

// probeNVML loads NVML and reads the driver version.
func probeNVML() Component {
	c := Component{Name: "NVML"}
	err := withNVML([]string{"nvmlSystemGetDriverVersion"}, func(lib nvml.Interface, path string) error {
		v, ret := lib.SystemGetDriverVersion()
		if ret != nvml.SUCCESS {
			return fmt.Errorf("nvmlSystemGetDriverVersion: NVML error %d", int(ret))
		}
		c.Found, c.Path, c.Version = true, path, v
		return nil
	})
	switch {
	case err == nil:
		c.Detail = "telemetry: memory, clocks, power"
	case errors.As(err, new(nvmlMissing)):
		c.Detail = err.Error() + "; telemetry would say \"not measured\""
	default:
		c.Detail = err.Error()
	}
	return c
}

// byBus is the handle of the GPU at PCI address bus.
func byBus(lib nvml.Interface, bus string) (nvml.Device, error) {
	dev, ret := lib.DeviceGetHandleByPciBusId(bus)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvmlDeviceGetHandleByPciBusId_v2(%s): NVML error %d", bus, int(ret))
	}
	return dev, nil
}

// readPowerLimit reads the power limit of the GPU at PCI address bus
// through NVML.
func readPowerLimit(g *GPUInfo, bus string) error {
	return withNVML([]string{"nvmlDeviceGetHandleByPciBusId_v2", "nvmlDeviceGetPowerManagementLimit"}, func(lib nvml.Interface, _ string) error {
		dev, err := byBus(lib, bus)
		if err != nil {
			return err
		}
		mw, ret := dev.GetPowerManagementLimit()
		if ret != nvml.SUCCESS {
			return fmt.Errorf("nvmlDeviceGetPowerManagementLimit: NVML error %d", int(ret))
		}
		g.PowerLimitW = float64(mw) / 1000
		return nil
	})
}

// readNVLinks counts the active NVLinks of the GPU at each PCI address
// (nvmlDeviceGetNvLinkState over the link numbers, up to
// NVML_NVLINK_MAX_LINKS; a GPU without NVLink has none).
func readNVLinks(buses []string) ([]int, error) {
	links := make([]int, len(buses))
	err := withNVML([]string{"nvmlDeviceGetHandleByPciBusId_v2", "nvmlDeviceGetNvLinkState"}, func(lib nvml.Interface, _ string) error {
		for i, bus := range buses {
			dev, err := byBus(lib, bus)
			if err != nil {
				return err
			}
			for l := range nvml.NVLINK_MAX_LINKS {
				on, ret := dev.GetNvLinkState(l)
				if ret == nvml.ERROR_INVALID_ARGUMENT || ret == nvml.ERROR_NOT_SUPPORTED { // past the GPU's links, or none
					break
				}
				if ret != nvml.SUCCESS {
					return fmt.Errorf("nvmlDeviceGetNvLinkState(%s, link %d): NVML error %d", bus, l, int(ret))
				}
				if on == nvml.FEATURE_ENABLED {
					links[i]++
				}
			}
		}
		return nil
	})
	return links, err
}
