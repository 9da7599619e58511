package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestBenchDispatchPrintsPrediction: on the host device, bench dispatch
// prints the machine code's predicted ceiling beside the measured GB/s
// per SM, labelled as a prediction, for deepep and not for alltoall.
func TestBenchDispatchPrintsPrediction(t *testing.T) {
	var out, errb bytes.Buffer
	code := benchDispatch([]string{"--device", "host", "--preset", "tiny", "--ep", "2", "--dispatcher", "alltoall,deepep", "--sms", "2",
		"--warmup", "0", "--iters", "1"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	s := out.String()
	if !strings.Contains(s, "GB/s/SM  pred/SM") || !strings.Contains(s, "# pred/SM of deepep: predicted ceiling (from machine code, not measured): ") ||
		strings.Contains(s, "pred/SM of alltoall") {
		t.Errorf("output:\n%s", s)
	}
}
