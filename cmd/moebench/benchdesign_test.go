package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestBenchDispatchAsDesigned: bench dispatch's dispatch ms is the
// design's own test's (deepep: notify + dispatch; hybridep: allgather +
// preprocess + dispatch), each part shown beside it and said in a note;
// alltoall's has no parts; the host device holds no SMs (n/a).
func TestBenchDispatchAsDesigned(t *testing.T) {
	var out, errb bytes.Buffer
	code := benchDispatch([]string{"--wide", "--device", "host", "--preset", "tiny", "--ep", "2", "--dispatcher", "alltoall,deepep,hybridep", "--sms", "2",
		"--warmup", "0", "--iters", "1"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	s := out.String()
	for _, want := range []string{"dispatch ms", "parts ms", "notify ", " + dispatch ", "allgather ", " + preprocess ",
		"# dispatch ms of deepep: notify + dispatch, as DeepEP's test_intranode.py",
		"# dispatch ms of hybridep: allgather + preprocess + dispatch, as HybridEP's test_hybrid_ep.py",
		"# SMs held by deepep at 2: n/a"} {
		if !strings.Contains(s, want) {
			t.Errorf("no %q in:\n%s", want, s)
		}
	}
	if strings.Contains(s, "dispatch ms of alltoall") {
		t.Errorf("alltoall has a dispatch as designed:\n%s", s)
	}
}
