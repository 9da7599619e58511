package main

import (
	"bufio"
	"errors"
	"github.com/moebench/moebench/internal/hostsim"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moebench/moebench/results"
)

// TestInterruptKeepsWhatWasMeasured: SIGINT (or SIGTERM) during a run's
// timed steps ends it after the step it is in, with exit status 130 and a
// record in --out marked interrupted that holds the steps timed so far;
// the file still reads, and 'moebench report' reads it.
func TestInterruptKeepsWhatWasMeasured(t *testing.T) {
	hostsim.SkipIfShort(t, "the harness's TestDeviceInterrupt and TestInterruptBeforeTheSteps")
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		out := filepath.Join(t.TempDir(), "r.jsonl")
		const iters = 100000
		cmd := exec.Command(os.Args[0], append(quick[:len(quick)-4:len(quick)-4], "--warmup", "0", "--iters", "100000", "--out", out)...)
		cmd.Env = append(os.Environ(), "MOEBENCH_TEST_PROCESS=1")
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		var log strings.Builder
		timed := make(chan bool, 1)
		go func() { // the progress line that names a timed step
			sc := bufio.NewScanner(stderr)
			sent := false
			for sc.Scan() {
				log.WriteString(sc.Text() + "\n")
				if !sent && strings.Contains(sc.Text(), "timed step") {
					timed <- true
					sent = true
				}
			}
			close(timed)
		}()
		select {
		case ok := <-timed:
			if !ok {
				t.Fatalf("%v: the run ended before its timed steps: %s", sig, log.String())
			}
		case <-time.After(2 * time.Minute):
			cmd.Process.Kill()
			t.Fatalf("%v: no timed step reported in 2 minutes", sig)
		}
		if err := cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		err = cmd.Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 130 {
			t.Fatalf("%v: exit %v, want 130; stderr:\n%s", sig, err, log.String())
		}
		recs, err := results.ReadFile(out, func(w string) { t.Errorf("%v: reading --out: %s", sig, w) })
		if err != nil || len(recs) != 1 {
			t.Fatalf("%v: --out: %v, %d records", sig, err, len(recs))
		}
		r := recs[0]
		if r.Status != results.StatusOK || !strings.Contains(r.Interrupted, "SIG") || r.Timing == nil || r.Timing.Iters < 1 || r.Timing.Iters >= iters ||
			len(r.Timing.Step.Samples) != r.Timing.Iters || !strings.Contains(r.Timing.Stopped, "interrupted") {
			t.Errorf("%v: record status %s, interrupted %q, timing %+v", sig, r.Status, r.Interrupted, r.Timing)
		}
		if code, _, e := cli("report", out); code != exitOK {
			t.Errorf("%v: report: exit %d: %s", sig, code, e)
		}
	}
}
