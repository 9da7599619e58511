package launch

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Verdict is one process's outcome of the set-up it does alone before the
// processes meet in NCCL: "" (ready), or its status (unavailable, failed)
// and why.
type Verdict struct {
	Status, Reason string
}

// AgreeWait bounds how long a process waits at an agreement for the others
// to arrive: each first sets up its share of the layer alone (draws and
// uploads its experts' weights), which takes minutes on the largest layers.
var AgreeWait = 10 * time.Minute

// Agree gives every process every process's verdict (in process order) on
// what is about to run — a point of a sweep: all run it or none does, so
// that no process waits in NCCL for one that left it out. The n-th Agree
// of every process meets the n-th of the others, through files beside
// File (FILE.pN.agreeN) tagged with the run's tag, which rank 0 draws; a
// file an earlier run left is never read as this one's (session). Without
// File (NCCL_COMM_ID alone) there is nothing to meet through: mine alone
// comes back, and a process that fails before meeting is found by the
// others' timeout in NCCL's setup instead, which names it only where it is
// the one other process (Watch.Unmet).
func (r *Rendezvous) Agree(mine Verdict) ([]Verdict, error) {
	if r.File == "" {
		return []Verdict{mine}, nil
	}
	wait := max(r.Timeout, AgreeWait)
	end := time.Now().Add(wait)
	first := r.agreed == 0
	if first { // what this process's earlier runs left
		old, _ := filepath.Glob(fmt.Sprintf("%s.p%d.agree*", r.File, r.L.Rank))
		for _, f := range old {
			os.Remove(f)
		}
	}
	if err := r.session(end); err != nil {
		return nil, err
	}
	r.agreed++
	line := strings.NewReplacer("\n", " ", "\r", " ").Replace(mine.Status + "\t" + mine.Reason)
	if err := writeAtomic(r.agreeFile(r.L.Rank, r.agreed), r.run+"\n"+line+"\n"); err != nil {
		return nil, fmt.Errorf("--rendezvous: %w", err)
	}
	if r.agreed > 2 { // every process has read it: each read it before writing its next one
		os.Remove(r.agreeFile(r.L.Rank, r.agreed-2))
	}
	out := make([]Verdict, r.L.World)
	have := make([]bool, r.L.World)
	for {
		if first && r.L.Rank == 0 { // the others wait for the run's tag with their hello in it
			if err := r.announce(); err != nil {
				return nil, err
			}
		}
		var missing []string
		for p := range r.L.World {
			if have[p] {
				continue
			}
			b, err := os.ReadFile(r.agreeFile(p, r.agreed))
			run, v, _ := strings.Cut(string(b), "\n")
			if err != nil || run != r.run || !strings.HasSuffix(v, "\n") {
				missing = append(missing, fmt.Sprint(p))
				continue
			}
			st, why, _ := strings.Cut(strings.TrimSuffix(v, "\n"), "\t")
			out[p], have[p] = Verdict{st, why}, true
		}
		if missing == nil {
			return out, nil
		}
		if time.Now().After(end) {
			return nil, fmt.Errorf("process(es) %s of %d never reached the set-up's end (agreement %d, in %s) within %v: killed, stuck, or launched with other flags?",
				strings.Join(missing, ", "), r.L.World, r.agreed, filepath.Dir(r.File), wait)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// session makes the run's tag known to this process. Each process writes
// a hello (FILE.pN.hello, a random word); rank 0 draws the tag and writes
// it with every hello it has read (FILE.run, again whenever one changes,
// until its first agreement is met); another process takes the tag only
// from a FILE.run that holds its own hello — written after it started, so
// not a crashed run's.
func (r *Rendezvous) session(end time.Time) error {
	if r.run != "" {
		return nil
	}
	var b [12]byte
	rand.Read(b[:])
	r.hello = hex.EncodeToString(b[:])
	if err := writeAtomic(fmt.Sprintf("%s.p%d.hello", r.File, r.L.Rank), r.hello+"\n"); err != nil {
		return fmt.Errorf("--rendezvous: %w", err)
	}
	if r.L.Rank == 0 {
		rand.Read(b[:])
		r.run = fmt.Sprintf("run %s world %d job %q", hex.EncodeToString(b[:]), r.L.World, r.L.Job)
		return r.announce()
	}
	mine := fmt.Sprintf("p%d %s", r.L.Rank, r.hello)
	for {
		if b, err := os.ReadFile(r.File + ".run"); err == nil {
			lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
			if len(lines) > r.L.Rank+1 && lines[r.L.Rank+1] == mine {
				r.run = lines[0]
				return nil
			}
		}
		if time.Now().After(end) {
			return fmt.Errorf("process %d: rank 0 never answered in --rendezvous %s (no %s.run naming this process after %v): is rank 0 running, and does this node see the files rank 0 writes?",
				r.L.Rank, r.File, r.File, max(r.Timeout, AgreeWait))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// announce (rank 0) writes FILE.run: the tag, then each process's hello
// as read now, when that differs from what it last wrote.
func (r *Rendezvous) announce() error {
	text := r.run + "\n"
	for p := range r.L.World {
		h := "-"
		if b, err := os.ReadFile(fmt.Sprintf("%s.p%d.hello", r.File, p)); err == nil && strings.HasSuffix(string(b), "\n") {
			h = strings.TrimSuffix(string(b), "\n")
		}
		text += fmt.Sprintf("p%d %s\n", p, h)
	}
	if text == r.announced {
		return nil
	}
	r.announced = text
	if err := writeAtomic(r.File+".run", text); err != nil {
		return fmt.Errorf("--rendezvous: %w", err)
	}
	return nil
}

func (r *Rendezvous) agreeFile(p, n int) string { return fmt.Sprintf("%s.p%d.agree%d", r.File, p, n) }

// writeAtomic writes text to path through a temporary file, so that a
// reader sees all of it or nothing.
func writeAtomic(path, text string) error {
	tmp := fmt.Sprintf("%s.tmp%d", path, os.Getpid())
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}
