package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/moebench/moebench/harness/setup"
)

// TestHostMemoryEstimate runs the real binary (built without the race
// detector, which would inflate its memory) on layers whose host memory is
// led by different parts — the per-rank-pair bookkeeping that grows with
// EP², the expert weights (held, or drawn when used; their weight
// gradients held, or each rank's released after its backward), the float64
// reference, feplb's weight copies — and checks that the estimate the
// memory guard refuses by, and the command bounds Go's heap to, is at least
// the process's measured peak RSS (see peakRSS).
func TestHostMemoryEstimate(t *testing.T) {
	bin, _ := buildBinary(t)
	for _, args := range [][]string{
		{"--ep", "8", "--experts", "8"},
		{"--ep", "128", "--experts", "128"},
		{"--ep", "1024", "--experts", "1024"},
		{"--ep", "8", "--dispatcher", "deepep", "--tokens", "256"},
		{"--ep", "64", "--experts", "64", "--dispatcher", "feplb", "--domain", "8", "--tokens", "64", "--routing", "skewed:1.5"},
		{"--ep", "4", "--experts", "32", "--hidden", "1024", "--ffn", "512", "--tokens", "16"},
		{"--ep", "4", "--experts", "32", "--hidden", "1024", "--ffn", "512", "--tokens", "16", "--host-experts", "grads-by-rank"},
		{"--ep", "4", "--experts", "32", "--hidden", "1024", "--ffn", "512", "--tokens", "16", "--host-experts", "drawn"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			t.Parallel()
			args = append([]string{"--device", "host", "--tokens", "1", "--warmup", "0", "--iters", "2"}, args...)
			var o options
			fs := newFlags(&o)
			if err := fs.Parse(args); err != nil {
				t.Fatal(err)
			}
			cfg, err := o.config(fs)
			if err != nil {
				t.Fatal(err)
			}
			peak, out, err := peakRSS(exec.Command(bin, args...))
			if err != nil || peak == 0 {
				t.Fatalf("%v: peak RSS %d: %v\n%s", args, peak, err, out)
			}
			est := setup.HostBytes(cfg)
			t.Logf("%v: peak RSS %.1f MiB, estimate %.1f MiB", args[8:], float64(peak)/(1<<20), float64(est)/(1<<20))
			if int64(peak) > est {
				t.Errorf("%v: peak RSS %d bytes is above the estimate, %d", args, peak, est)
			}
		})
	}
}

// peakRSS runs cmd and returns its peak resident memory, the high-water mark
// the kernel keeps for the process's own memory (VmHWM), read until it
// exits. (The rusage a parent gets from wait4 would not do: the child's
// ru_maxrss starts at the parent's own peak, the test binary's.)
func peakRSS(cmd *exec.Cmd) (peak int, out []byte, err error) {
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Start(); err != nil {
		return 0, nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	status := fmt.Sprintf("/proc/%d/status", cmd.Process.Pid)
	for {
		select {
		case err := <-done:
			return peak, buf.Bytes(), err
		default:
		}
		if b, err := os.ReadFile(status); err == nil {
			for _, line := range strings.Split(string(b), "\n") {
				var kb int
				if _, err := fmt.Sscanf(line, "VmHWM: %d kB", &kb); err == nil {
					peak = max(peak, kb<<10)
				}
			}
		}
		time.Sleep(time.Millisecond)
	}
}
