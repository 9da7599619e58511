package check

import (
	"fmt"
	"math"

	"github.com/moebench/moebench/harness/layer"
	"github.com/moebench/moebench/kernels/device"
	"github.com/moebench/moebench/results"
)

// checkedTokens picks the tokens the check of dl compares (checkSample).
func checkedTokens(dl *layer.DeviceLayer) ([][]int, string) { return checkSample(dl.Layer.Cfg) }

// CheckDevice runs one step with poisoned outputs and compares the output with the
// float64 reference (on a sample of tokens for large layers).
func CheckDevice(dl *layer.DeviceLayer) (*results.Correctness, error) {
	c := dl.Layer.Cfg
	T, h, k, E := c.Tokens, c.Hidden, c.TopK, c.Experts
	const nan = 0x7fc0 // a bf16 NaN; as two 16-bit words, an fp32 NaN too
	for r, rk := range dl.Ranks {
		if !dl.Local(r) {
			continue
		}
		for _, p := range []struct {
			ptr   device.Addr
			words int
		}{{rk.Y, T * h}, {rk.Probs, 2 * T * k}, {dl.RankBufs[r].Logits, 2 * T * E}, {rk.ExpertY, dl.RankBufs[r].Out.Rows * h}} {
			if p.ptr != 0 {
				if err := rk.Dev.Fill16(p.ptr, nan, int64(p.words), rk.Stream); err != nil {
					return nil, err
				}
			}
		}
		if err := rk.Dev.Fill16(rk.Idx, 0xffff, int64(2*T*k), rk.Stream); err != nil { // expert −1
			return nil, err
		}
		if dl.Train {
			if err := dl.PoisonGrads(r); err != nil {
				return nil, err
			}
		}
	}
	if err := dl.Step(); err != nil {
		return nil, err
	}
	if err := dl.Download(); err != nil {
		return nil, err
	}
	cr := &results.Correctness{Checked: true, Tolerance: Tolerance, Metric: errMetricAt(dl.Layer.Cfg.ResolvedPrecision()),
		RoundTrip: "not run on the device: the layer check covers dispatch and combine"}
	sample, which := checkedTokens(dl)
	cr.Sample = which
	for r := range dl.Ranks {
		for _, e := range dl.Layer.Ranks[r].Idx {
			if dl.Local(r) && (e < 0 || int(e) >= E) && cr.Detail == "" {
				cr.MaxRelErr, cr.Detail = math.Inf(1), fmt.Sprintf("rank %d: the router left expert %d (of %d) in its output", r, e, E)
			}
		}
	}
	if cr.Detail == "" {
		dl.Distributed.Local("computing the float64 reference of its ranks")
		dl.Layer.Cfg.ProgressLine().Work(StageRef, float64(dl.Layer.Cfg.Experts))
		compareReference(cr, dl.Layer, localSample(dl, sample))
	}
	cr.Passed = cr.Detail == "" && cr.MaxRelErr <= Tolerance
	if !cr.Passed && cr.Detail == "" {
		cr.Detail = fmt.Sprintf("max relative error %.3g (tolerance %g)", cr.MaxRelErr, Tolerance)
	}
	if dl.Train {
		if err := checkDeviceGrads(dl, cr, sample != nil); err != nil {
			return nil, err
		}
	}
	if dl.Distributed != nil { // every process's verdict, the same on all
		return agreeCheck(dl, cr)
	}
	return cr, nil
}
