package harness

import (
	"fmt"

	"github.com/moebench/moebench/harness/layer"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/results"
)

// dumpDevice writes --dump's files of the last step: with a training step's
// gradients, every expert's weight gradients downloaded from its owner.
func dumpDevice(dl *layer.DeviceLayer, env setup.Env, rec *results.Record) error {
	if env.Dump == "" {
		return nil
	}
	if dl.Train {
		if err := dl.DownloadGrads(); err != nil {
			return fmt.Errorf("--dump: %w", err)
		}
		L := dl.Layer.Shape.LocalExperts()
		for r, hr := range dl.Layer.Ranks {
			hr.ExpertGrads = hr.ExpertGrads[:0]
			for e := r * L; e < (r+1)*L; e++ {
				g, err := dl.ExpertGrads(e)
				if err != nil {
					return fmt.Errorf("--dump: %w", err)
				}
				hr.ExpertGrads = append(hr.ExpertGrads, g)
			}
		}
	}
	return dump(env, dl.Layer, rec)
}
