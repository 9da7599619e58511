package layer

import (
	"errors"
	"fmt"
	"testing"

	"github.com/moebench/moebench/internal/cuda"
)

// TestCaptureRefused: only the driver's refusal of a call that cannot be
// captured (900), with the capture it invalidated (901) beside it, is a
// refusal; a 901 with a fault of the capture (isolation, 905) on another
// device, a 901 alone, 906, 907 or an error of another kind fail the run.
func TestCaptureRefused(t *testing.T) {
	e := func(code int) error {
		return &cuda.Error{Call: "cuStreamEndCapture", Code: code, Name: fmt.Sprint("code ", code)}
	}
	wrap := func(err error) error { return fmt.Errorf("micro-batch 0 rank 1 wgrad: %w", err) }
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{e(900), true},
		{wrap(e(900)), true},
		{errors.Join(wrap(e(900)), e(900)), true},
		{errors.Join(e(901), wrap(e(900))), true},
		{fmt.Errorf("capture: %w", errors.Join(e(901), e(900))), true},
		{errors.Join(e(901), e(905)), false},
		{errors.Join(e(901), e(900), e(905)), false},
		{errors.Join(e(900), errors.New("emu: stream order: ...")), false},
		{e(901), false},
		{e(905), false},
		{e(906), false},
		{e(907), false},
		{errors.New("no capture"), false},
		{nil, false},
	} {
		if got := captureRefused(tc.err); got != tc.want {
			t.Errorf("captureRefused(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
