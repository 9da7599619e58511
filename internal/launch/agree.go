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
// File (FILE.pN.agreeN), tagged with the run rank 0 started (FILE.run),
// so that a file an earlier run left is never read as this one's. Without
// File (NCCL_COMM_ID alone) there is nothing to meet through: mine alone
// comes back, and a process that fails before meeting is found by the
// others' timeout instead.
func (r *Rendezvous) Agree(mine Verdict) ([]Verdict, error) {
	if r.File == "" {
		return []Verdict{mine}, nil
	}
	end := time.Now().Add(max(r.Timeout, AgreeWait))
	if err := r.session(end); err != nil {
		return nil, err
	}
	if r.agreed == 0 { // what this process's earlier runs left
		old, _ := filepath.Glob(fmt.Sprintf("%s.p%d.agree*", r.File, r.L.Rank))
		for _, f := range old {
			os.Remove(f)
		}
	}
	r.agreed++
	line := strings.NewReplacer("\n", " ", "\r", " ").Replace(mine.Status + "\t" + mine.Reason)
	write := func() error { return writeAtomic(r.agreeFile(r.L.Rank, r.agreed), r.run+"\n"+line+"\n") }
	if err := write(); err != nil {
		return nil, fmt.Errorf("--rendezvous: %w", err)
	}
	if r.agreed > 2 { // every process has read it: each read it before writing its next one
		os.Remove(r.agreeFile(r.L.Rank, r.agreed-2))
	}
	out := make([]Verdict, r.L.World)
	have := make([]bool, r.L.World)
	for {
		if r.L.Rank != 0 && r.agreed == 1 && !have[0] { // the tag read may be a crashed run's: rank 0 rewrites it
			if b, err := os.ReadFile(r.File + ".run"); err == nil && strings.HasSuffix(string(b), "\n") && strings.TrimSuffix(string(b), "\n") != r.run {
				r.run = strings.TrimSuffix(string(b), "\n")
				clear(have)
				if err := write(); err != nil {
					return nil, fmt.Errorf("--rendezvous: %w", err)
				}
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
				strings.Join(missing, ", "), r.L.World, r.agreed, filepath.Dir(r.File), max(r.Timeout, AgreeWait))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// session reads the run's tag, which rank 0 draws and writes (FILE.run)
// at its first agreement; the others wait for it until end.
func (r *Rendezvous) session(end time.Time) error {
	if r.run != "" {
		return nil
	}
	p := r.File + ".run"
	if r.L.Rank == 0 {
		var b [12]byte
		rand.Read(b[:])
		r.run = fmt.Sprintf("run %s world %d job %q", hex.EncodeToString(b[:]), r.L.World, r.L.Job)
		if err := writeAtomic(p, r.run+"\n"); err != nil {
			return fmt.Errorf("--rendezvous: %w", err)
		}
		return nil
	}
	want := fmt.Sprintf(" world %d job %q", r.L.World, r.L.Job)
	for {
		if b, err := os.ReadFile(p); err == nil && strings.HasSuffix(string(b), want+"\n") {
			r.run = strings.TrimSuffix(string(b), "\n")
			return nil
		}
		if time.Now().After(end) {
			return fmt.Errorf("process %d: rank 0 never started the run in --rendezvous %s (no %s after %v): is rank 0 running, and does this node see the files rank 0 writes?",
				r.L.Rank, r.File, p, max(r.Timeout, AgreeWait))
		}
		time.Sleep(50 * time.Millisecond)
	}
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
