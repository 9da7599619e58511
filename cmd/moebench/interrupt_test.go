package main

import (
	"bufio"
	"errors"
	"github.com/moebench/moebench/internal/hostsim"
	"io"
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
		lines := watchLines(stderr, "timed step") // the progress line that names a timed step
		if found, late := lines.wait(hostsim.Patience(t, 2*time.Minute)); !found {
			cmd.Process.Kill()
			if late {
				t.Fatalf("%v: no timed step reported in time", sig)
			}
			t.Fatalf("%v: the run ended before its timed steps: %s", sig, lines.text())
		}
		if err := cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		err = cmd.Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 130 {
			t.Fatalf("%v: exit %v, want 130; stderr:\n%s", sig, err, lines.text())
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

// lineWatch reads a child's output as it comes, for a test that acts when
// a line appears.
type lineWatch struct {
	found chan bool     // true when the line came; false when the stream ended without it
	done  chan struct{} // closed when the stream has ended
	log   strings.Builder
}

// watchLines starts reading r for a line that contains want.
func watchLines(r io.Reader, want string) *lineWatch {
	w := &lineWatch{found: make(chan bool, 1), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		sc := bufio.NewScanner(r)
		sent := false
		for sc.Scan() {
			w.log.WriteString(sc.Text() + "\n")
			if !sent && strings.Contains(sc.Text(), want) {
				w.found <- true
				sent = true
			}
		}
		if !sent {
			w.found <- false
		}
	}()
	return w
}

// wait waits at most d for the line: found, or not and late when d
// passed first.
func (w *lineWatch) wait(d time.Duration) (found, late bool) {
	select {
	case ok := <-w.found:
		return ok, false
	case <-time.After(d):
		return false, true
	}
}

// text is everything read, once the stream has ended (after the child
// exited or was killed).
func (w *lineWatch) text() string {
	<-w.done
	return w.log.String()
}
