package setup

import "github.com/moebench/moebench/dispatchers"

// CheckDispatcherAvailable is the availability gate of cfg's dispatcher and implementation on
// cfg's device (resolved: host or cuda): nil when it can be built here, an
// error that dispatchers.IsUnavailable recognises when a requirement is
// missing (a library, the device), with the reason. It builds the
// dispatcher and drops it; a run can still find it unavailable later, for
// limits that only a layer's shape or the GPUs show (its record says why).
func CheckDispatcherAvailable(cfg Config) error {
	var err error
	if cfg.Device == "host" {
		_, err = dispatchers.New(cfg.Dispatcher, cfg.Impl, cfg.DispatcherEnv())
	} else {
		_, err = dispatchers.NewDevice(cfg.Dispatcher, cfg.Impl, cfg.DispatcherEnv())
	}
	return err
}
