// Package feplb will hold FEPLB (arXiv 2604.19654): two-phase dispatch, phase 1
// through a base EP dispatcher, phase 2 moving dynamic experts' tokens and
// weights inside the NVLink domain with copy engines, planned by a CPU
// scheduler during the static experts' compute.
//
// Not implemented in this build: it registers a factory that reports the dispatcher unavailable, with
// the reason, so runs and sweeps record "unavailable" rather than a timing.
package feplb

import "github.com/moebench/moebench/dispatchers"

func init() {
	dispatchers.Register("feplb", dispatchers.Pending("feplb", "copy-engine transfers between GPUs of an NVLink domain"))
}
