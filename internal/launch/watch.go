package launch

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Watch keeps a distributed run from hanging. Each process says, in a
// status file beside the rendezvous file, what stage it is in (one that
// may wait on the others, or work of its own) and that it is alive (a
// counter it advances twice a second); a process that fails writes a note
// there naming its ranks, the stage and the error. A watchdog in every
// process stops it (Exit) as soon as a note appears, or when a peer's
// counter stands still (a killed process), or when its own stage has
// waited longer than the timeout while no other process moved on to
// another stage or worked on its own (a hang: it then names the processes
// that are silent, or in another stage) — every process exits naming the
// failing one, none hangs in a collective call that will never return.
// Without a rendezvous file (NCCL_COMM_ID) only the timeout stops a
// process, and the failing one cannot be named.
type Watch struct {
	r       *Rendezvous
	tag     string // the run's communicator: notes and statuses of other runs are ignored
	ranks   string // this process's ranks, e.g. "ranks 2–3 (process 1 of 2 on node-b)"
	timeout time.Duration
	// Exit stops the process with a message (default: print it to stderr
	// and exit with status 1).
	Exit func(msg string)

	mu       sync.Mutex
	stage    string
	deadline time.Time // zero: work of its own
	stages   int       // stages entered
	count    int
	done     chan struct{}
	wg       sync.WaitGroup
	heard    map[int]heard // each peer's last counter and when it changed
}

type heard struct {
	count, stage string
	at, moved    time.Time // when its counter, and its stage, last changed
}

// StaleAfter is how long a peer's counter may stand still before the
// peer is taken for dead (at most half the timeout, at least 3 s).
func (w *Watch) staleAfter() time.Duration {
	return max(3*time.Second, min(w.timeout/2, 30*time.Second))
}

// Watch starts watching a run whose communicator id is id; ranks describes
// this process's ranks.
func (r *Rendezvous) Watch(id [128]byte, ranks string) *Watch {
	w := &Watch{r: r, tag: fmt.Sprintf("%x.%d", id[:12], r.seq), ranks: ranks, timeout: r.Timeout, done: make(chan struct{}),
		heard: map[int]heard{}, stage: "setting up", deadline: time.Now().Add(r.Timeout)}
	w.Exit = func(msg string) {
		fmt.Fprintf(os.Stderr, "moebench: %s\n", msg)
		os.Exit(1)
	}
	if r.File != "" {
		os.Remove(w.note(r.L.Rank))
	}
	w.wg.Add(1)
	go w.loop()
	return w
}

func (w *Watch) status(p int) string { return fmt.Sprintf("%s.p%d.status", w.r.File, p) }
func (w *Watch) note(p int) string   { return fmt.Sprintf("%s.p%d.failed", w.r.File, p) }

// Stage says that the process enters stage s, which may wait on the other
// processes: it must end within the timeout.
func (w *Watch) Stage(s string) { w.StageFor(s, w.timeout) }

// StageFor is Stage for a stage that may take up to d (the timeout, or
// longer).
func (w *Watch) StageFor(s string, d time.Duration) {
	w.mu.Lock()
	w.stage, w.deadline = s, time.Now().Add(max(d, w.timeout))
	w.stages++
	w.mu.Unlock()
}

// Local says that the process does work of its own in stage s (it waits
// on no other process): no timeout until the next Stage.
func (w *Watch) Local(s string) {
	w.mu.Lock()
	w.stage, w.deadline = s, time.Time{}
	w.stages++
	w.mu.Unlock()
}

// Fail records that this process failed in its stage with err: the note
// the others stop on. An error in a stage that waits on the others may be
// another process's doing (NCCL's connection to a killed process fails):
// Fail first gives the watchdog the time to find a process that stopped
// responding or failed before, which then stops this one naming it.
func (w *Watch) Fail(err error) {
	if w.r.File != "" {
		select {
		case <-w.done:
		case <-time.After(w.staleAfter() + time.Second):
		}
	}
	w.mu.Lock()
	stage := w.stage
	w.mu.Unlock()
	w.writeNote(fmt.Sprintf("%s failed in %s: %v", w.ranks, stage, err))
}

func (w *Watch) writeNote(text string) {
	if w.r.File == "" {
		return
	}
	p := w.note(w.r.L.Rank)
	os.WriteFile(p+".tmp", []byte(w.tag+"\n"+text+"\n"), 0o644)
	os.Rename(p+".tmp", p)
}

// Stop ends the watch (the run is over on this process).
func (w *Watch) Stop() {
	select {
	case <-w.done:
		return
	default:
	}
	close(w.done)
	w.wg.Wait()
	if w.r.File != "" {
		os.Remove(w.status(w.r.L.Rank))
	}
}

func (w *Watch) loop() {
	defer w.wg.Done()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-w.done:
			return
		case <-tick.C:
		}
		if msg := w.check(); msg != "" {
			select {
			case <-w.done: // the run ended meanwhile
				return
			default:
			}
			w.Exit(msg)
			return
		}
	}
}

// check advances this process's counter and looks at the others: "" while
// all is well, else why this process must stop.
func (w *Watch) check() string {
	w.mu.Lock()
	w.count++
	stage, deadline, count, stages := w.stage, w.deadline, w.count, w.stages
	w.mu.Unlock()
	now := time.Now()
	if w.r.File == "" {
		if !deadline.IsZero() && now.After(deadline) {
			return fmt.Sprintf("%s waited %v in %s for the other processes (--comm-timeout): one failed or hangs; without --rendezvous FILE it cannot be named", w.ranks, w.timeout, stage)
		}
		return ""
	}
	if count%2 == 0 {
		p := w.status(w.r.L.Rank)
		os.WriteFile(p+".tmp", []byte(fmt.Sprintf("%s\n%d\n%s\n%s\n%d %t\n", w.tag, count, w.ranks, stage, stages, deadline.IsZero())), 0o644)
		os.Rename(p+".tmp", p)
	}
	var silent, elsewhere []string
	moving := false // another process moved on, or works on its own, within the timeout
	for p := range w.r.L.World {
		if p == w.r.L.Rank {
			continue
		}
		if b, err := os.ReadFile(w.note(p)); err == nil {
			if tag, text, _ := strings.Cut(string(b), "\n"); tag == w.tag {
				return "stopping: " + strings.TrimSpace(text)
			}
		}
		b, err := os.ReadFile(w.status(p))
		f := strings.Split(string(b), "\n")
		if err != nil || len(f) < 5 || f[0] != w.tag {
			continue // not there yet, or done
		}
		h, ok := w.heard[p]
		if !ok {
			h = heard{stage: f[4], moved: now}
		}
		if h.count != f[1] {
			h.count, h.at = f[1], now
		}
		if h.stage != f[4] {
			h.stage, h.moved = f[4], now
		}
		w.heard[p] = h
		moving = moving || now.Sub(h.moved) < w.timeout || strings.HasSuffix(f[4], " true")
		if age := now.Sub(h.at); age > 1500*time.Millisecond {
			silent = append(silent, fmt.Sprintf("%s silent for %.1f s in %s (killed, or stuck outside moebench?)", f[2], age.Seconds(), f[3]))
			if age > w.staleAfter() {
				msg := fmt.Sprintf("%s stopped responding: silent for %.1f s in %s (killed, or stuck outside moebench?)", f[2], age.Seconds(), f[3])
				w.writeNote(msg)
				return "stopping: " + msg
			}
		} else if f[3] != stage {
			elsewhere = append(elsewhere, fmt.Sprintf("%s is in %s", f[2], f[3]))
		}
	}
	if deadline.IsZero() || !now.After(deadline) || moving && len(silent) == 0 {
		return ""
	}
	why := "every process is in it (a hang inside NCCL?)"
	if len(silent) > 0 {
		why = strings.Join(silent, "; ")
	} else if len(elsewhere) > 0 {
		why = strings.Join(elsewhere, "; ") + " (alive: raise --comm-timeout if it is only slow)"
	}
	msg := fmt.Sprintf("%s waited %v in %s (--comm-timeout): %s", w.ranks, w.timeout, stage, why)
	w.writeNote(msg)
	return "stopping: " + msg
}

// Describe names process p's ranks first…last and its node, as notes and
// messages name them.
func Describe(first, last, p, world int, host string) string {
	rs := "rank " + strconv.Itoa(first)
	if last > first {
		rs = fmt.Sprintf("ranks %d–%d", first, last)
	}
	return fmt.Sprintf("%s (process %d of %d on %s)", rs, p, world, host)
}
