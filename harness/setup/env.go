package setup

import (
	"io"
	"time"

	"github.com/moebench/moebench/dispatchers"
	"github.com/moebench/moebench/internal/launch"
	"github.com/moebench/moebench/kernels/device"
)

// Env is what a run needs besides its configuration.
type Env struct {
	Version    string // moebench version for the record
	DeviceNote string // why this device was chosen (recorded and printed)
	// Now stamps the record; nil means time.Now.
	Now func() time.Time
	// Dump, if set, is a directory to write the layer's tensors to (see Dump)
	// once it has run, also when its check failed.
	Dump string
	// OpenDevices opens the devices of a cuda run: n of them, or when n is
	// 0 as many as there are up to most (one per rank). Nil opens GPUs
	// (device.OpenGPUs); tests pass Emus (device.Emu).
	OpenDevices func(n, most int) ([]device.Device, error)
	// Progress, if set, gets a line every ProgressEvery (default
	// DefaultProgressEvery) once a run has taken that long: what it is
	// doing, the steps done and the time left. Nothing of it goes into the
	// record.
	Progress      io.Writer
	ProgressEvery time.Duration
	// Rendezvous, in a run launched over several processes
	// (internal/launch), meets them and watches them; nil or one process:
	// a run of this process alone.
	Rendezvous *launch.Rendezvous
	// Interrupt, if set, stops the run early when it fires (a signal): the
	// record holds what was measured and is marked interrupted. In a run
	// over several processes, every process is given one or none: they
	// stop together, where all agree to (agreeStop).
	Interrupt *Interrupt
}

// ForwardOnlyReason says why a run of cfg that was not asked to be
// forward-only must be: its dispatcher's implementation on the cuda device
// has no backward in this build (in its own words where it gives them,
// Capabilities.NoBackward); "" when its backward can run (or the
// dispatcher cannot be built, which the run itself reports).
func ForwardOnlyReason(cfg Config) string {
	if cfg.ForwardOnly || cfg.Device == "host" {
		return ""
	}
	d, err := dispatchers.NewDevice(cfg.Dispatcher, cfg.Impl, cfg.DispatcherEnv())
	if err != nil {
		return ""
	}
	return d.Capabilities().NoBackward
}

// ForwardOnlyReason is ForwardOnlyReason(cfg) for a run in env. A run over
// several processes trains as one process does: of the designs that run
// across them, alltoall --impl library and hybridep's native kernels have
// a backward (NCCL EP's modes say why not, as in one process), and each
// process checks its own ranks' gradients (devbackward.go's checkGrads);
// the others are refused across processes (newDist) whatever their pass.
func (env Env) ForwardOnlyReason(cfg Config) string { return ForwardOnlyReason(cfg) }
