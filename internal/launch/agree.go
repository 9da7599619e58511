package launch

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
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
// file an earlier run left is never read as this one's (session). While it
// waits, waiting (when not nil) is told whom for; "" when the wait is
// over. Without File (NCCL_COMM_ID alone) there is nothing to meet
// through: mine alone comes back, and a process that fails before meeting
// is found by the others' timeout in NCCL's setup instead, which names it
// only where it is the one other process (Watch.Unmet).
func (r *Rendezvous) Agree(mine Verdict, waiting func(string)) ([]Verdict, error) {
	if r.File == "" {
		return []Verdict{mine}, nil
	}
	line := strings.NewReplacer("\n", " ", "\r", " ").Replace(mine.Status + "\t" + mine.Reason)
	wait := max(r.Timeout, AgreeWait)
	all, missing, err := r.exchange(line, wait, func(missing []int, waited time.Duration) {
		if waiting != nil {
			waiting(fmt.Sprintf("waiting for %s of %d to end its set-up (%.0f s of %v)", r.processes(missing), r.L.World, waited.Seconds(), wait))
		}
	}, nil)
	if waiting != nil {
		waiting("")
	}
	if err != nil {
		return nil, err
	}
	if missing != nil {
		return nil, fmt.Errorf("%s of %d never reached the set-up's end (agreement %d, in %s) within %v: killed, stuck, or launched with other flags?",
			r.processes(missing), r.L.World, r.agreed, filepath.Dir(r.File), wait)
	}
	out := make([]Verdict, r.L.World)
	for p, v := range all {
		st, why, _ := strings.Cut(v, "\t")
		out[p] = Verdict{st, why}
	}
	return out, nil
}

// Setting is one setting that every process of a run must share: its
// name as the user gives it (a flag, "--seed", or a launcher's variable)
// and its value.
type Setting struct{ Name, Value string }

// Meet is the processes' meeting before each builds its layer (a run's, or
// a sweep point's): each gives the others its settings, which must be the
// same on every process — with the run's number of processes (the
// launcher's variable) first —, else every process gets a *DifferError
// naming each that differs with each process's value. The first Meet
// waits at most Wait (--rendezvous-timeout) for the others to start,
// saying every few seconds on progress whom it waits for; a process that
// never arrives is named in its error. Without File (NCCL_COMM_ID alone)
// nothing is exchanged here (the settings go over NCCL once the processes
// met there).
func (r *Rendezvous) Meet(mine []Setting, progress io.Writer) error {
	if r.File == "" {
		return nil
	}
	if r.unmet != nil { // a sweep's later point: the processes that did not meet, or differed, still do not
		return r.unmet
	}
	err := r.meet(mine, progress)
	var de *DifferError
	if errors.As(err, &de) || r.gaveUp {
		r.unmet = err
	}
	return err
}

func (r *Rendezvous) meet(mine []Setting, progress io.Writer) error {
	mine = append([]Setting{r.L.worldSetting()}, mine...)
	text := encodeSettings(mine)
	first := r.agreed == 0
	wait := max(r.Timeout, AgreeWait)
	if first {
		wait = r.Wait
	}
	start, said := time.Now(), time.Duration(0)
	say := func(missing []int, waited time.Duration) {
		if progress != nil && waited-said >= 5*time.Second {
			said = waited
			fmt.Fprintf(progress, "moebench: process %d of %d: waiting for %s of %d at --rendezvous %s (%.0f s of --rendezvous-timeout %v)\n",
				r.L.Rank, r.L.World, r.processes(missing), r.L.World, r.File, waited.Seconds(), wait)
		}
	}
	// at the first meeting a process that differs ends it at once (the
	// others may wait for processes that do not exist: another world);
	// at a later one every process has every file (an agreement is read
	// by all before any writes its next)
	var stop func(string) bool
	if first {
		stop = func(theirs string) bool { return theirs != text }
	}
	all, missing, err := r.exchange(text, wait, say, stop)
	if err != nil {
		return err
	}
	settings := make([][]Setting, len(all))
	for p, v := range all {
		if v != "" || p == r.L.Rank {
			settings[p] = decodeSettings(v)
		}
	}
	if err := Compare(settings); err != nil {
		return err
	}
	if missing != nil {
		return fmt.Errorf("process %d of %d: %s of %d never arrived at --rendezvous %s within %v (--rendezvous-timeout; it waited %.0f s): not started, started with another --rendezvous or another %s, "+
			"or unable to see the folder %s? (raise --rendezvous-timeout if it starts later)",
			r.L.Rank, r.L.World, r.processes(missing), r.L.World, r.File, wait, time.Since(start).Seconds(), r.L.worldName(), filepath.Dir(r.File))
	}
	return nil
}

// exchange writes mine as this process's next agreement and reads every
// process's (in process order), at most wait; waiting is told whom it
// waits for as it does. Without stop, it ends when every process's is
// there; stop ends it early at another process's that it says is enough.
// missing: the processes whose agreement never came (their entries "").
func (r *Rendezvous) exchange(mine string, wait time.Duration, waiting func(missing []int, waited time.Duration), stop func(string) bool) (all []string, missing []int, err error) {
	start := time.Now()
	end := start.Add(wait)
	first := r.agreed == 0
	if first { // what this process's earlier runs left (files of ours only)
		prefix := filepath.Base(r.agreeFile(r.L.Rank, 0))
		prefix = prefix[:len(prefix)-1]
		es, _ := os.ReadDir(filepath.Dir(r.File))
		for _, e := range es {
			if n, ok := strings.CutPrefix(e.Name(), prefix); ok {
				if _, err := strconv.Atoi(n); err == nil {
					r.drop(filepath.Join(filepath.Dir(r.File), e.Name()))
				}
			}
		}
	}
	if err := r.session(end, waiting); err != nil {
		return nil, nil, err
	}
	r.agreed++
	if err := r.put(r.agreeFile(r.L.Rank, r.agreed), "agreement", r.run+"\n"+mine+"\n"); err != nil {
		return nil, nil, err
	}
	if r.agreed > 2 { // every process has read it: each read it before writing its next one
		r.drop(r.agreeFile(r.L.Rank, r.agreed-2))
	}
	all = make([]string, r.L.World)
	have := make([]bool, r.L.World)
	all[r.L.Rank], have[r.L.Rank] = mine, true
	for {
		if first && r.L.Rank == 0 { // the others wait for the run's tag with their hello in it
			if err := r.announce(); err != nil {
				return nil, nil, err
			}
		}
		missing = nil
		for p := range r.L.World {
			if have[p] {
				continue
			}
			text, _ := get(r.agreeFile(p, r.agreed))
			run, v, _ := strings.Cut(text, "\n")
			if run != r.run || !strings.HasSuffix(v, "\n") {
				missing = append(missing, p)
				continue
			}
			all[p], have[p] = strings.TrimSuffix(v, "\n"), true
			if stop != nil && p != r.L.Rank && stop(all[p]) {
				return all, nil, nil
			}
		}
		if missing == nil {
			return all, nil, nil
		}
		if time.Now().After(end) {
			r.gaveUp = true
			return all, missing, nil
		}
		waiting(missing, time.Since(start))
		time.Sleep(50 * time.Millisecond)
	}
}

// session makes the run's tag known to this process. Each process writes
// a hello (FILE.pN.hello, a random word); rank 0 draws the tag and writes
// it with every hello it has read (FILE.run, again whenever one changes,
// until its first agreement is met); another process takes the tag only
// from a FILE.run that holds its own hello — written after it started, so
// not a crashed run's. A tag of fewer processes than this one's rank is
// a *DifferError (another world).
func (r *Rendezvous) session(end time.Time, waiting func([]int, time.Duration)) error {
	if r.run != "" {
		return nil
	}
	start := time.Now()
	var b [12]byte
	rand.Read(b[:])
	r.hello = hex.EncodeToString(b[:])
	if err := r.put(r.helloFile(r.L.Rank), "hello", r.hello+"\n"); err != nil {
		return err
	}
	if r.L.Rank == 0 {
		rand.Read(b[:])
		r.run = fmt.Sprintf("run %s world %d job %q", hex.EncodeToString(b[:]), r.L.World, r.L.Job)
		r.runWorld = r.L.World
		return r.announce()
	}
	mine := fmt.Sprintf("p%d %s", r.L.Rank, r.hello)
	for {
		if text, ok := get(r.File + ".run"); ok {
			lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
			w := 0
			if f := strings.Fields(lines[0]); len(f) > 3 && f[2] == "world" {
				w, _ = strconv.Atoi(f[3])
			}
			if len(lines) > r.L.Rank+1 && lines[r.L.Rank+1] == mine {
				r.run, r.runWorld = lines[0], w
				return nil
			}
			if w > 0 && w <= r.L.Rank { // rank 0's run has no place for this process
				return &DifferError{[]string{fmt.Sprintf("%s differs: process 0 has %d, process %d has %d", r.L.worldName(), w, r.L.Rank, r.L.World)}}
			}
		}
		if time.Now().After(end) {
			return fmt.Errorf("process %d of %d: process 0 never answered at --rendezvous %s within %v (no %s.run naming this process; --rendezvous-timeout): is rank 0 running, with the same --rendezvous, and does this node see the files rank 0 writes?",
				r.L.Rank, r.L.World, r.File, end.Sub(start).Round(time.Second), r.File)
		}
		waiting([]int{0}, time.Since(start))
		time.Sleep(50 * time.Millisecond)
	}
}

// announce (rank 0) writes FILE.run: the tag, then each process's hello
// as read now, when that differs from what it last wrote.
func (r *Rendezvous) announce() error {
	text := r.run + "\n"
	for p := range r.L.World {
		h := "-"
		if t, ok := get(r.helloFile(p)); ok && strings.HasSuffix(t, "\n") {
			h = strings.TrimSuffix(t, "\n")
		}
		text += fmt.Sprintf("p%d %s\n", p, h)
	}
	if text == r.announced {
		return nil
	}
	r.announced = text
	return r.put(r.File+".run", "tag", text)
}

// processes names processes ps ("process 1", "processes 1, 3").
func (r *Rendezvous) processes(ps []int) string {
	var s []string
	for _, p := range ps {
		s = append(s, strconv.Itoa(p))
	}
	if len(s) == 1 {
		return "process " + s[0]
	}
	return "processes " + strings.Join(s, ", ")
}

// encodeSettings writes settings a line each, name and value split by a
// tab (neither holds a line break: they are replaced).
func encodeSettings(ss []Setting) string {
	clean := strings.NewReplacer("\n", " ", "\r", " ", "\t", " ")
	var b strings.Builder
	for _, s := range ss {
		fmt.Fprintf(&b, "%s\t%s\x1e", clean.Replace(s.Name), clean.Replace(s.Value))
	}
	return b.String()
}

func decodeSettings(text string) []Setting {
	var out []Setting
	for _, l := range strings.Split(text, "\x1e") {
		if n, v, ok := strings.Cut(l, "\t"); ok {
			out = append(out, Setting{n, v})
		}
	}
	return out
}

// DifferError: the processes of a run were launched with settings that
// differ; each line names one and each process's value.
type DifferError struct{ Lines []string }

func (e *DifferError) Error() string {
	return "the processes of this run were launched with different settings (every process must build the same layer and run it the same way; launch each with the same flags): " +
		strings.Join(e.Lines, "; ")
}

// Compare is a *DifferError when the processes' settings (all[p]: process
// p's; nil: not known) differ, naming each that does, in the order the
// first process that has it lists them, with each known process's value
// ("(none)" for one that lacks it); nil when they agree.
func Compare(all [][]Setting) error {
	var names []string
	vals := map[string]map[int]string{}
	for p, ss := range all {
		for _, s := range ss {
			if vals[s.Name] == nil {
				vals[s.Name] = map[int]string{}
				names = append(names, s.Name)
			}
			vals[s.Name][p] = s.Value
		}
	}
	var lines []string
	for _, n := range names {
		var each []string
		same := true
		first := ""
		for p, ss := range all {
			if ss == nil {
				continue
			}
			v, ok := vals[n][p]
			if !ok {
				v = "(none)"
			}
			if len(each) == 0 {
				first = v
			}
			same = same && v == first
			each = append(each, fmt.Sprintf("process %d has %s", p, v))
		}
		if !same {
			lines = append(lines, n+" differs: "+strings.Join(each, ", "))
		}
	}
	if lines == nil {
		return nil
	}
	return &DifferError{lines}
}
