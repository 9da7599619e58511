// Package deepep will hold the DeepEP normal (intranode) design: a fused layout/notify
// step, SM-driven transfers whose SM budget is --sms, no separate permute
// pass, and a host wait for the receive counts.
//
// Not implemented in this build: it registers a factory that reports the dispatcher unavailable, with
// the reason, so runs and sweeps record "unavailable" rather than a timing.
package deepep

import "github.com/moebench/moebench/dispatchers"

func init() {
	dispatchers.Register("deepep", dispatchers.Pending("deepep", "SM-driven transfers into peer memory"))
}
