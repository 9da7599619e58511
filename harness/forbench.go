package harness

import (
	"slices"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/kernels/device"
	"github.com/moebench/moebench/results"
)

// What the benchmarks (package harness/bench) use of the run's layers, as
// Run uses it. These name parts of the device and host layers, which move
// out of this package later (docs/design.md, Packages).

// CloseDevices closes the devices OpenDevices opened.
func CloseDevices(devs []device.Device) { closeDevices(devs) }

// TuneGEMMs lets the GPUs among devs time each new GEMM shape's cuBLASLt
// algorithms, or stops them (a timing waits for the stream).
func TuneGEMMs(devs []device.Device, on bool) { tuneGEMMs(devs, on) }

// GroupedSides are the numbers of extra streams per rank the layer tries
// for its expert GEMMs.
func GroupedSides() []int { return slices.Clone(groupedSides) }

// NewRecord is the record a run of cfg starts from: its configuration, the
// stack, the ranks and the SM budget.
func NewRecord(cfg Config, env Env) *results.Record { return newRecord(cfg, env) }

// ResolvedPrecision is cfg.Precision, bf16 where unset.
func (c Config) ResolvedPrecision() string { return c.precision() }

// DispatcherEnv is where cfg's dispatcher runs, with its options.
func (c Config) DispatcherEnv() dispatchers.Env { return c.dispatcherEnv() }

// MemAvailable is the memory the system can give, where it says.
func MemAvailable() (float64, bool) { return memAvailable() }

// RanksNote says where a device run's ranks on devs are and how data moves
// between them.
func RanksNote(ep int, devs []device.Device) string { return ranksNote(ep, devs, "") }

// RoutedLayer is cfg's layer without its experts' weights, every rank's
// routing drawn on the host.
func RoutedLayer(cfg Config) (*Layer, error) {
	l, err := newLayer(cfg, false)
	if err != nil {
		return nil, err
	}
	for r := range l.Ranks {
		if err := l.route(r); err != nil {
			return nil, err
		}
	}
	return l, nil
}
