//go:build race

package harnesstest

// RaceDetector: the race detector's sync.Pool drops some of what is put
// back, so allocation counts are not asserted under it.
const RaceDetector = true
