package check

import (
	"math"
	"strings"
	"sync"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/harness/layer"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/results"
)

// checkDeviceGrads compares the gradients of the step check ran with the float64
// reference and fills cr.Grads, or says in cr.Sample why they were not
// compared: the reference of every token's gradients is beyond the
// check's budget when the forward's check samples tokens (sampled). In a
// run over several processes each process compares its own ranks' input
// and probability gradients and its own experts' weight gradients, whose
// reference takes every rank's tokens (GatherRouting brings the other
// processes' routing), and the router's and shared expert's main_grad
// summed over every process (downloadGrads); agreeCheck then gives every
// process every verdict.
func checkDeviceGrads(dl *layer.DeviceLayer, cr *results.Correctness, sampled bool) error {
	if sampled {
		cr.Sample += "; gradients not checked: their float64 reference (every token: the weight gradients sum over all of them) exceeds the check's budget at this shape"
		return nil
	}
	if dl.Distributed != nil {
		if err := dl.GatherRouting(); err != nil {
			return err
		}
	}
	if err := dl.DownloadGrads(); err != nil {
		return err
	}
	dl.Distributed.Local("computing the float64 gradient reference")
	dl.Layer.Cfg.ProgressLine().Work(StageGradRef, float64(dl.Layer.Cfg.Experts))
	var mu sync.Mutex
	var failed error
	g := &results.GradCheck{Tolerance: kernels.GradTolerance, Metric: kernels.GradErrMetric, Note: gradNote, RoundTrip: layer.DeviceGradRoundTrip}
	cmp := NewGradCompare(dl.Layer)
	if dl.Distributed != nil {
		cmp.local = dl.Local
		g.Note += "; " + layer.DistGradNote
	}
	cmp.expertGrads = func(e int) dispatchers.ExpertWeights {
		mu.Lock() // one download at a time
		defer mu.Unlock()
		w, err := dl.ExpertGrads(e)
		if err != nil && failed == nil {
			failed = err
		}
		return w
	}
	accs := cmp.finishAcc()
	if failed != nil {
		return failed
	}
	g.PerTensor = map[string]float64{}
	for n, a := range accs {
		g.PerTensor[n] = a.Err()
		g.MaxRelErr = math.Max(g.MaxRelErr, a.Err())
	}
	cr.Grads = g
	if dl.Distributed != nil { // the verdict is the run's, from every process's maxima (agreeCheck)
		dl.GradAcc = accs
		return nil
	}
	if why := gradDetail(g); why != "" {
		cr.Passed = false
		cr.Detail = strings.TrimPrefix(cr.Detail+"; "+why, "; ")
	}
	return nil
}
