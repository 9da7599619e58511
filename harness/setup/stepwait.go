package setup

import (
	"time"
)

// stepWait is the least derived limit on a call after the first step (a
// phase of a step): --watchdog-timeout 0 means 6 × the longer of
// --comm-timeout and --ncclep-timeout when larger (the dispatchers' own
// waits on the GPU end at those and report; Config.WatchdogLimit).
const stepWait = 30 * time.Second
