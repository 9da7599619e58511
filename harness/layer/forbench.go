package layer

import (
	"slices"

	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/kernels/device"
)

// What the benchmarks (package harness/bench) use of the layers beyond what
// Run uses: views of the layer in the forms the benchmarks take.

// GroupedSides are the numbers of extra streams per rank the layer tries
// for its expert GEMMs.
func GroupedSides() []int { return slices.Clone(GroupedSideStreams) }

// RankPlacementNote says where a device run's ranks on devs are and how data moves
// between them.
func RankPlacementNote(ep int, devs []device.Device) string {
	return RankPlacementNoteVia(ep, devs, "")
}

// NewRoutedLayer is cfg's layer without its experts' weights, every rank's
// routing drawn on the host.
func NewRoutedLayer(cfg setup.Config) (*Layer, error) {
	l, err := MakeLayer(cfg, false)
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
