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
// Without a rendezvous file (NCCL_COMM_ID alone) the processes share
// nothing but NCCL, so only the timeout stops a process, and it says what
// it knows (unmet): in NCCL's communicator setup, that its own ranks
// joined and which other processes' did not — named where there is one
// other process, else all the candidates (NCCL's bootstrap does not say
// which of them is missing) — and that --rendezvous FILE names it.
type Watch struct {
	r       *Rendezvous
	tag     string // the run's communicator: notes and statuses of other runs are ignored
	ranks   string // this process's ranks, e.g. "ranks 2–3 (process 1 of 2 on node-b)"
	per     int    // ranks per process (process p's are p·per …)
	timeout time.Duration
	// Exit stops the process with a message (default: print it to stderr
	// and exit with status 1).
	Exit func(msg string)

	mu       sync.Mutex
	stage    string
	meeting  bool      // the stage is the processes' first meeting (NCCL's communicator setup): no other process is known to be there
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
// this process's ranks, per ranks each process drives.
func (r *Rendezvous) Watch(id [128]byte, ranks string, per int) *Watch {
	w := &Watch{r: r, tag: fmt.Sprintf("%x.%d", id[:12], r.seq), ranks: ranks, per: per, timeout: r.Timeout, done: make(chan struct{}),
		heard: map[int]heard{}, stage: "setting up", deadline: time.Now().Add(r.Timeout)}
	w.Exit = func(msg string) {
		fmt.Fprintf(os.Stderr, "moebench: %s\n", msg)
		os.Exit(1)
	}
	if r.File != "" {
		w.r.drop(w.note(r.L.Rank))
	}
	w.wg.Add(1)
	go w.loop()
	return w
}

func (w *Watch) status(p int) string { return w.r.statusFile(p) }
func (w *Watch) note(p int) string   { return w.r.noteFile(p) }

// Stage says that the process enters stage s, which may wait on the other
// processes: it must end within the timeout.
func (w *Watch) Stage(s string) { w.StageFor(s, w.timeout) }

// StageFor is Stage for a stage that may take up to d (the timeout, or
// longer).
func (w *Watch) StageFor(s string, d time.Duration) { w.enter(s, d, false) }

// Meeting is Stage for the processes' first meeting, NCCL's communicator
// setup, which ends once every process's ranks joined it.
func (w *Watch) Meeting(s string) { w.enter(s, w.timeout, true) }

func (w *Watch) enter(s string, d time.Duration, meeting bool) {
	w.mu.Lock()
	w.stage, w.deadline, w.meeting = s, time.Now().Add(max(d, w.timeout)), meeting
	w.stages++
	w.mu.Unlock()
}

// Unmet says what this process knows of the others in its meeting (an
// error of NCCL's setup adds it to its own), without a rendezvous file:
// that its ranks joined, and which other processes' did not; "" with a
// rendezvous file (the watch names them) or outside the meeting.
func (w *Watch) Unmet() string {
	w.mu.Lock()
	meeting := w.meeting
	w.mu.Unlock()
	if w.r.File != "" || !meeting {
		return ""
	}
	return w.unnamed(true)
}

// unnamed is what a process without a rendezvous file knows of the others
// when it waited too long: in the meeting (NCCL's setup), which processes'
// ranks did not join it; after, which may have failed.
func (w *Watch) unnamed(meeting bool) string {
	l := w.r.L
	var others []string
	for p := range l.World {
		if p != l.Rank {
			others = append(others, w.process(p))
		}
	}
	root := ""
	if id := os.Getenv("NCCL_COMM_ID"); id != "" {
		root = fmt.Sprintf(" at NCCL_COMM_ID=%s (rank 0's process hosts NCCL's bootstrap root there)", id)
	}
	launcher := "their own output, or the launcher's, says which and why"
	switch {
	case meeting && len(others) == 1:
		return fmt.Sprintf("this process's ranks joined NCCL's communicator setup%s; %s, the run's only other process, never joined it: it failed or was killed before meeting, "+
			"was launched with other flags, cannot reach NCCL_COMM_ID, or is still setting up (raise --comm-timeout if it is only slow); its own output, or the launcher's, says why. "+
			"With --rendezvous FILE the processes agree before they meet, and a process that cannot run says why in every process's error",
			root, others[0])
	case meeting:
		return fmt.Sprintf("this process's ranks joined NCCL's communicator setup%s; of %s, one or more never joined it (failed or killed before meeting, launched with other flags, "+
			"unable to reach NCCL_COMM_ID, or still setting up): NCCL's bootstrap does not say which, and with NCCL_COMM_ID alone the processes share nothing else, so %s; "+
			"--rendezvous FILE (a path every node sees) makes every process name it",
			root, strings.Join(others, ", "), launcher)
	case len(others) == 1:
		return fmt.Sprintf("%s, the run's only other process, failed, was killed or hangs (its own output says which); with --rendezvous FILE every process names it and its stage", others[0])
	}
	return fmt.Sprintf("one of %s failed, was killed or hangs: with NCCL_COMM_ID alone the processes share nothing but NCCL, so %s; "+
		"--rendezvous FILE (a path every node sees) makes every process name it and its stage", strings.Join(others, ", "), launcher)
}

// process names process p by its ranks.
func (w *Watch) process(p int) string {
	if w.per <= 1 {
		return fmt.Sprintf("process %d (rank %d)", p, p*max(w.per, 1))
	}
	return fmt.Sprintf("process %d (ranks %d–%d)", p, p*w.per, (p+1)*w.per-1)
}

// Local says that the process does work of its own in stage s (it waits
// on no other process): no timeout until the next Stage.
func (w *Watch) Local(s string) {
	w.mu.Lock()
	w.stage, w.deadline, w.meeting = s, time.Time{}, false
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
	w.r.put(w.note(w.r.L.Rank), "note", w.tag+"\n"+text+"\n")
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
		w.r.drop(w.status(w.r.L.Rank))
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
	stage, deadline, count, stages, meeting := w.stage, w.deadline, w.count, w.stages, w.meeting
	w.mu.Unlock()
	now := time.Now()
	if w.r.File == "" {
		if !deadline.IsZero() && now.After(deadline) {
			return fmt.Sprintf("%s waited %v in %s for the other processes (--comm-timeout): %s", w.ranks, w.timeout, stage, w.unnamed(meeting))
		}
		return ""
	}
	if count%2 == 0 {
		w.r.put(w.status(w.r.L.Rank), "status", fmt.Sprintf("%s\n%d\n%s\n%s\n%d %t\n", w.tag, count, w.ranks, stage, stages, deadline.IsZero()))
	}
	var silent, elsewhere []string
	moving := false // another process moved on, or works on its own, within the timeout
	for p := range w.r.L.World {
		if p == w.r.L.Rank {
			continue
		}
		if b, ok := get(w.note(p)); ok {
			if tag, text, _ := strings.Cut(b, "\n"); tag == w.tag {
				return "stopping: " + strings.TrimSpace(text)
			}
		}
		b, ok := get(w.status(p))
		f := strings.Split(b, "\n")
		if !ok || len(f) < 5 || f[0] != w.tag {
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
