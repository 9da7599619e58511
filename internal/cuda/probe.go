// Package cuda opens the CUDA libraries at run time with dlopen — no cuda.h,
// no toolkit at build time — through small cgo trampolines over moebench's
// own prototypes: the driver, NVRTC, cuBLASLt, cuBLAS, NCCL and NCCL EP;
// NVML (driver version, power limit, NVLinks) through go-nvml. A missing
// library is an ordinary error, never a crash.
//
// Where each library is looked for: docs/setup.md; why dlopen:
// docs/design.md.
package cuda

// GPU is one device the driver reports.
type GPU struct {
	Ordinal int
	Name    string
}

// Probe reports the driver's version (e.g. 13000 for CUDA 13.0) and its GPUs.
// An error says what was missing: the library, a symbol, or cuInit's status.
// MOEBENCH_LIBCUDA overrides where libcuda.so.1 is looked for.
func Probe() (driver int, gpus []GPU, err error) {
	d, err := OpenDriver()
	if err != nil {
		return 0, nil, err
	}
	if driver, err = d.Version(); err != nil {
		return 0, nil, err
	}
	n, err := d.DeviceCount()
	if err != nil {
		return driver, nil, err
	}
	for i := range n {
		name, err := d.Name(i)
		if err != nil {
			return driver, gpus, err
		}
		gpus = append(gpus, GPU{Ordinal: i, Name: name})
	}
	return driver, gpus, nil
}
