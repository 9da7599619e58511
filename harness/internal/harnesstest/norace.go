//go:build !race

package harnesstest

// RaceDetector is false: built without the race detector.
const RaceDetector = false
