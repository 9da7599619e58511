package setup

import (
	"github.com/moebench/moebench/dispatchers"
)

// DispatcherEnv is where cfg's dispatcher runs, with its options.
func (c Config) DispatcherEnv() dispatchers.Env {
	return dispatchers.Env{Device: c.Device, Base: c.FeplbBase, Domain: c.Domain, Dynamic: c.FeplbDyn, Policy: c.FeplbPolicy, Hidden: c.Hidden, FFN: c.FFN,
		SMs: c.SMs, PreprocessSMs: c.PreprocessSMs, PermuteSMs: c.PermuteSMs, CommTimeout: c.CommTimeout, LibraryTimeout: c.NCCLEPTimeout, Precision: c.ResolvedPrecision()}
}
