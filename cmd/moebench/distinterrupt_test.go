package main

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moebench/moebench/internal/hostsim"
	"github.com/moebench/moebench/results"
)

// sigProc is one process of a distributed run that a test signals: its
// stderr is read as it comes, so that the test sees what stage it is in.
type sigProc struct {
	cmd    *exec.Cmd
	stdout bytes.Buffer
	mu     sync.Mutex
	log    strings.Builder
	read   chan struct{} // closed once stderr is read to its end
	done   chan error
}

// stderr is what the process wrote to stderr so far.
func (p *sigProc) stderr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// startGroup starts world processes of one run in one new process group
// (as a shell starts a pipeline: Ctrl-C signals all of them), env(r) added
// to process r's environment; it returns them and the group's id.
func startGroup(t *testing.T, world int, env func(r int) []string, args ...string) ([]*sigProc, int) {
	t.Helper()
	var ps []*sigProc
	pgid := 0
	for r := range world {
		p := &sigProc{cmd: exec.Command(os.Args[0], args...), read: make(chan struct{}), done: make(chan error, 1)}
		p.cmd.Env = append(os.Environ(), "MOEBENCH_TEST_PROCESS=1", fmt.Sprintf("MOEBENCH_RANK=%d", r), fmt.Sprintf("MOEBENCH_WORLD=%d", world),
			"FAKENCCL_TIMEOUT_S=120", "MOEBENCH_DEBUG=1")
		if env != nil {
			p.cmd.Env = append(p.cmd.Env, env(r)...)
		}
		p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pgid: pgid}
		p.cmd.Stdout = &p.stdout
		pipe, err := p.cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if pgid == 0 {
			pgid = p.cmd.Process.Pid
		}
		go func() {
			sc := bufio.NewScanner(pipe)
			for sc.Scan() {
				p.mu.Lock()
				p.log.WriteString(sc.Text() + "\n")
				p.mu.Unlock()
			}
			close(p.read)
		}()
		go func() {
			<-p.read // Wait closes the pipe: read it to its end first
			p.done <- p.cmd.Wait()
			close(p.done)
		}()
		ps = append(ps, p)
	}
	t.Cleanup(func() {
		for _, p := range ps {
			p.cmd.Process.Kill()
		}
	})
	return ps, pgid
}

// waitFor waits until p's stderr holds s (at most d on an idle machine):
// false when p ended first or the time ran out.
func (p *sigProc) waitFor(t *testing.T, s string, d time.Duration) bool {
	t.Helper()
	end := time.Now().Add(hostsim.Patience(t, d))
	for time.Now().Before(end) {
		if strings.Contains(p.stderr(), s) {
			return true
		}
		select {
		case <-p.read:
			return strings.Contains(p.stderr(), s)
		case <-time.After(50 * time.Millisecond):
		}
	}
	return false
}

// waitFile waits until path exists (at most d on an idle machine).
func waitFile(t *testing.T, path string, d time.Duration) bool {
	t.Helper()
	end := time.Now().Add(hostsim.Patience(t, d))
	for time.Now().Before(end) {
		if _, err := os.Stat(path); err == nil {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// TestDistributedInterrupt: SIGINT or SIGTERM to a run over two processes
// — to both (their process group, as Ctrl-C in a shell) or to one of them
// (kill PID) — ends every process with exit status 130, and rank 0 writes
// one record, marked interrupted and naming the signal and the process it
// reached: during the timed steps it holds the steps every process
// completed (the same on all: the processes agree before each step
// whether to stop), every rank's times over them; before the timed steps
// (during the set-up, or the warm-up) a failed record, nothing timed.
// --out stays valid JSON lines, and the rendezvous folder is left empty.
// Once over NCCL_COMM_ID alone (no rendezvous file): the agreement goes
// over the communicator, not over files.
func TestDistributedInterrupt(t *testing.T) {
	hostsim.SkipIfShort(t, "the harness's TestInterruptBeforeTheSteps and TestDeviceInterrupt (one process)")
	_, out := distributedSetup(t)
	const iters = 100000
	for _, c := range []struct {
		name    string
		sig     syscall.Signal
		to      int  // the process signalled; −1: the process group (both)
		commID  bool // NCCL_COMM_ID alone, no --rendezvous
		warmup  int
		when    string // signal once the process signalled (both: process 0) says this on stderr; "": once process 1 wrote its hello
		timed   bool   // the record holds timed steps
		stopped string // in the record's interrupted field
	}{
		{name: "group-SIGINT-timed", sig: syscall.SIGINT, to: -1, when: "timed step", timed: true, stopped: "SIGINT to process"},
		{name: "process-1-SIGTERM-timed", sig: syscall.SIGTERM, to: 1, when: "timed step", timed: true, stopped: "SIGTERM to process 1 before timed step "},
		{name: "process-0-SIGINT-comm-id", sig: syscall.SIGINT, to: 0, commID: true, when: "timed step", timed: true, stopped: "SIGINT to process 0 before timed step "},
		{name: "process-1-SIGTERM-setup", sig: syscall.SIGTERM, to: 1, stopped: "SIGTERM to process 1 while building the layer"},
		{name: "group-SIGTERM-warm-up", sig: syscall.SIGTERM, to: -1, warmup: iters, when: "warm-up step", stopped: "before warm-up step "},
	} {
		t.Run(c.name, func(t *testing.T) {
			os.Remove(out)
			dir := t.TempDir()
			rv := filepath.Join(dir, "rv")
			args := []string{"--device", "cuda", "--dispatcher", "alltoall", "--impl", "library", "--ep", "4",
				"--experts", "16", "--tokens", "16", "--hidden", "32", "--ffn", "16", "--warmup", fmt.Sprint(c.warmup), "--iters", fmt.Sprint(iters),
				"--out", out, "--format", "json", "--comm-timeout", commTimeout(t)}
			var env func(int) []string
			if c.commID {
				l, err := net.Listen("tcp", "127.0.0.1:0") // a free port for NCCL's bootstrap root
				if err != nil {
					t.Fatal(err)
				}
				port := l.Addr().(*net.TCPAddr).Port
				l.Close()
				env = func(int) []string { return []string{fmt.Sprintf("NCCL_COMM_ID=127.0.0.1:%d", port)} }
			} else {
				args = append(args, "--rendezvous", rv)
			}
			ps, pgid := startGroup(t, 2, env, args...)
			logs := func() string {
				var b strings.Builder
				for r, p := range ps {
					fmt.Fprintf(&b, "process %d's stderr:\n%s\n", r, p.stderr())
				}
				return b.String()
			}
			watched := ps[max(c.to, 0)]
			if c.when == "" {
				if !waitFile(t, rv+".p1.hello", 2*time.Minute) {
					t.Fatalf("process 1 never wrote its hello:\n%s", logs())
				}
			} else if !watched.waitFor(t, c.when, 4*time.Minute) {
				t.Fatalf("no %q on stderr:\n%s", c.when, logs())
			}
			var err error
			if c.to < 0 {
				err = syscall.Kill(-pgid, c.sig)
			} else {
				err = ps[c.to].cmd.Process.Signal(c.sig)
			}
			if err != nil {
				t.Fatal(err)
			}
			for r, p := range ps {
				select {
				case err := <-p.done:
					if code := exitCode(err); code != exitInterrupted {
						t.Errorf("process %d: exit %d (%v), want %d", r, code, err, exitInterrupted)
					}
				case <-time.After(hostsim.Patience(t, 2*time.Minute)):
					t.Fatalf("process %d still running 2 minutes after the signal:\n%s", r, logs())
				}
			}
			if t.Failed() {
				t.Fatalf("%s", logs())
			}
			if ps[1].stdout.Len() > 0 || !strings.Contains(ps[1].stderr(), "rank 0 writes the record") {
				t.Errorf("process 1 wrote %q", ps[1].stdout.String())
			}
			recs, err := results.ReadFile(out, func(w string) { t.Errorf("reading --out: %s", w) })
			if err != nil || len(recs) != 1 {
				t.Fatalf("--out: %v, %d records\n%s", err, len(recs), logs())
			}
			r := recs[0]
			if !strings.Contains(r.Interrupted, c.stopped) || !strings.Contains(r.Interrupted, signalName(c.sig)) {
				t.Errorf("interrupted %q, want %q", r.Interrupted, c.stopped)
			}
			if c.timed {
				tm := r.Timing
				if r.Status != results.StatusOK || tm == nil || tm.Iters < 1 || tm.Iters >= iters || len(tm.Step.Samples) != tm.Iters ||
					tm.Stopped != fmt.Sprintf("interrupted by %s after %d of %d timed iterations", strings.SplitN(r.Interrupted, " before", 2)[0], tm.Iters, iters) {
					t.Fatalf("record status %s (%s), timing %+v", r.Status, r.Reason, tm)
				}
				for _, ph := range tm.Phases { // every rank's times, over the same steps
					if len(ph.PerRank) != 4 || len(ph.Samples) != tm.Iters {
						t.Errorf("%s: %d ranks' times, %d samples", ph.Name, len(ph.PerRank), len(ph.Samples))
					}
					for rk, v := range ph.PerRank {
						if !(v > 0) {
							t.Errorf("%s: rank %d's time %v", ph.Name, rk, v)
						}
					}
				}
				if len(r.Ranks.Processes) != 2 {
					t.Errorf("processes %+v", r.Ranks.Processes)
				}
			} else if r.Status != results.StatusFailed || r.Timing != nil || !strings.Contains(r.Reason, "nothing was timed") {
				t.Errorf("record status %s (%s), timing %+v", r.Status, r.Reason, r.Timing)
			}
			if code, _, e := cli("report", out); code != exitOK {
				t.Errorf("report: exit %d: %s", code, e)
			}
			if left, _ := os.ReadDir(dir); len(left) > 0 {
				var names []string
				for _, e := range left {
					names = append(names, e.Name())
				}
				t.Errorf("the interrupted run left %v in the rendezvous folder", names)
			}
			t.Logf("%s; %s", r.Interrupted, logs())
		})
	}
}

// TestDistributedAgreementUntimed: the processes' agreement on whether to
// stop is made between steps, off the clock: with each agreement made 2 s
// slower (MOEBENCH_TEST_AGREE_DELAY, a slow network), every process makes
// 6 (after the build, after the check, before the warm-up step and each of
// the 3 timed steps), yet no step's host issue time holds one. (The fake
// driver's event clock counts records, not time: the steps' event times
// could not show a delay on the host; the host issue time runs from the
// step's first call, right before its start events, to its last.)
func TestDistributedAgreementUntimed(t *testing.T) {
	hostsim.SkipIfShort(t, "TestDistributedInterrupt/process-1-SIGTERM-timed")
	rv, out := distributedSetup(t)
	const delay = 2 * time.Second
	ps := launchProcsEnv(t, 2, func(int) []string { return []string{"MOEBENCH_TEST_AGREE_DELAY=" + delay.String()} },
		"--device", "cuda", "--dispatcher", "alltoall", "--impl", "library", "--ep", "4",
		"--experts", "16", "--tokens", "16", "--hidden", "32", "--ffn", "16", "--warmup", "1", "--iters", "3",
		"--rendezvous", rv, "--out", out, "--format", "json", "--comm-timeout", commTimeout(t))
	rec := runRecord(t, out, ps)
	for r, p := range ps {
		if want := fmt.Sprintf("6 agreements on whether to stop, each delayed %v", delay); !strings.Contains(p.stderr.String(), want) {
			t.Errorf("process %d's stderr lacks %q:\n%s", r, want, p.stderr.String())
		}
	}
	if s := rec.Timing.Step.Samples; len(s) != 3 || rec.Timing.HostIssue == nil || rec.Timing.HostIssue.P99 >= float64(delay.Milliseconds()) {
		t.Errorf("step samples %v; host issue %+v ms: a step holds the agreement's %v", s, rec.Timing.HostIssue, delay)
	}
	t.Logf("host issue %+v ms", rec.Timing.HostIssue)
}
