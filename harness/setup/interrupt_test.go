package setup

import (
	"testing"
)

// TestAgreedWhy: the interrupt that a run over several processes agrees
// on names each signal and the processes it reached; none fired: "".
func TestAgreedWhy(t *testing.T) {
	for _, c := range []struct {
		whys []string
		want string
	}{
		{[]string{"", ""}, ""},
		{[]string{"", "SIGTERM"}, "SIGTERM to process 1"},
		{[]string{"SIGINT", "SIGINT", ""}, "SIGINT to processes 0, 1"},
		{[]string{"SIGTERM", "SIGINT", "a test"}, "SIGINT to process 1, SIGTERM to process 0, an interrupt to process 2"},
	} {
		var codes []uint64
		for _, w := range c.whys {
			codes = append(codes, InterruptCode(w))
		}
		if got := DescribeInterrupts(codes); got != c.want {
			t.Errorf("%q: %q, want %q", c.whys, got, c.want)
		}
	}
}
