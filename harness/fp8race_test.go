//go:build race

package harness

// raceDetector: the race detector's sync.Pool drops some of what is put
// back, so allocation counts are not asserted under it.
const raceDetector = true
