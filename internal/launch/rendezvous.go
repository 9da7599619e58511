package launch

import (
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Rendezvous shares NCCL's unique id between the processes of a run, one
// id per communicator: the n-th ID call of every process meets the n-th of
// rank 0 (a sweep's points make one communicator each, in the same order
// on every process).
type Rendezvous struct {
	L       Launch
	File    string        // --rendezvous: where rank 0 writes the id ("" with NCCL_COMM_ID)
	Timeout time.Duration // --comm-timeout: how long the others wait for it
	// Wait (--rendezvous-timeout) bounds the processes' first meeting,
	// where each gives the others its settings (Meet): a process that
	// never starts is named within it
	Wait time.Duration
	seq  int
	// agree.go's: agreements made, the run's tag, this process's hello,
	// and (rank 0) the FILE.run it last wrote
	agreed                int
	run, hello, announced string
	runWorld              int   // the processes the tag names (rank 0's world)
	gaveUp                bool  // an agreement ended without every process
	unmet                 error // why the processes did not meet (Meet's), which a sweep's later points repeat
}

// DefaultWait is --rendezvous-timeout's default: long enough for a
// launcher to start every process, short enough that one that never
// starts is named soon.
const DefaultWait = time.Minute

// NewRendezvous checks that the run can meet: NCCL_COMM_ID is set, or file
// names a path in an existing folder (on a filesystem every node sees)
// that holds nothing, or a rendezvous file (an earlier run's); the files
// beside it this process writes (FILE.pN.*, rank 0's FILE.run) likewise.
// wait is --rendezvous-timeout (0: DefaultWait).
func NewRendezvous(l Launch, file string, timeout, wait time.Duration) (*Rendezvous, error) {
	if file == "" && os.Getenv("NCCL_COMM_ID") == "" {
		return nil, fmt.Errorf("a run over %d processes (%s) needs --rendezvous FILE (a path on a filesystem every node sees, where rank 0 writes NCCL's unique id) or NCCL_COMM_ID=host:port (NCCL's own bootstrap)", l.World, l.Via)
	}
	if wait == 0 {
		wait = DefaultWait
	}
	if wait < time.Second || wait > time.Hour {
		return nil, fmt.Errorf("--rendezvous-timeout=%v: must be in [1s, 1h]", wait)
	}
	r := &Rendezvous{L: l, File: file, Timeout: timeout, Wait: wait}
	if file != "" {
		dir := file[:strings.LastIndex("/"+file, "/")]
		if dir == "" {
			dir = "."
		}
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			return nil, fmt.Errorf("--rendezvous=%s: its folder %s does not exist", file, dir)
		}
		mine := []string{file, r.helloFile(l.Rank), r.doneFile(l.Rank), r.statusFile(l.Rank), r.noteFile(l.Rank)}
		if l.Rank == 0 {
			mine = append(mine, file+".run")
		}
		for _, p := range mine {
			if ok, what := r.mine(p); !ok {
				return nil, notOurs(file, p, what)
			}
		}
	}
	return r, nil
}

// ID is the next communicator's unique id on every process: with
// NCCL_COMM_ID set, newID's (NCCL derives it from the variable, the same on
// every process); else rank 0 calls newID and writes the id to File, and
// the others wait for it there, at most Timeout.
func (r *Rendezvous) ID(newID func() ([128]byte, error)) ([128]byte, error) {
	r.seq++
	if os.Getenv("NCCL_COMM_ID") != "" {
		return newID()
	}
	want := r.header()
	if r.L.Rank == 0 {
		id, err := newID()
		if err != nil {
			return id, err
		}
		return id, r.put(r.File, "id", want+"id "+hex.EncodeToString(id[:])+"\n")
	}
	end := time.Now().Add(r.Timeout)
	for {
		if id, ok := r.read(want); ok {
			return id, nil
		}
		if time.Now().After(end) {
			return [128]byte{}, fmt.Errorf("process %d: no NCCL id from rank 0 in --rendezvous %s after %v (communicator %d): is rank 0 running, and does this node see the file rank 0 writes? (--comm-timeout)",
				r.L.Rank, r.File, r.Timeout, r.seq)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// header is what the id file says before the id: the run's job, world and
// the communicator's number, so that a file an earlier run left is not
// read as this one's.
func (r *Rendezvous) header() string {
	return fmt.Sprintf("job %q\nworld %d\nseq %d\n%s\n", r.L.Job, r.L.World, r.seq, r.run)
}

// read is the id in File when its header is want.
func (r *Rendezvous) read(want string) ([128]byte, bool) {
	var id [128]byte
	text, ok := get(r.File)
	if !ok {
		return id, false
	}
	at := strings.LastIndex(text, "\nid ")
	if at < 0 {
		return id, false
	}
	b, err := hex.DecodeString(strings.TrimSuffix(text[at+len("\nid "):], "\n"))
	if text[:at+1] != want || err != nil || len(b) != len(id) {
		return id, false
	}
	copy(id[:], b)
	return id, true
}

// Close ends this process's part in the rendezvous: it says it is done
// (FILE.pN.done), and the last process of the run to say so — every other
// has read all it reads — removes the run's files, FILE among them: a run
// that ends leaves nothing. A process that never met the others removes
// its own.
func (r *Rendezvous) Close() {
	if r.File == "" {
		return
	}
	if r.run == "" || r.gaveUp { // the others never met: nothing of this process's is read
		r.drop(r.helloFile(r.L.Rank))
		for n := max(1, r.agreed-1); n <= r.agreed; n++ {
			r.drop(r.agreeFile(r.L.Rank, n))
		}
		if r.L.Rank == 0 {
			r.drop(r.File + ".run")
			r.drop(r.File)
		}
		return
	}
	world := r.runWorld // another world than rank 0's was refused: rank 0's processes are the run's
	if world <= 0 || world > r.L.World {
		world = r.L.World
	}
	if r.put(r.doneFile(r.L.Rank), "done", r.run+"\n") != nil {
		return
	}
	for p := range world {
		if t, ok := get(r.doneFile(p)); !ok || t != r.run+"\n" {
			return // another process goes on: the last one removes the files
		}
	}
	for p := range world {
		for n := max(1, r.agreed-1); n <= r.agreed; n++ {
			r.drop(r.agreeFile(p, n))
		}
		r.drop(r.helloFile(p))
		r.drop(r.statusFile(p))
	}
	r.drop(r.File)
	r.drop(r.File + ".run")
	for p := range world {
		r.drop(r.doneFile(p))
	}
}

// procFile is process p's file of a kind beside File, FILE.pN.KIND: the
// one place that spells their names (files.go's side knows an older
// moebench's).
func (r *Rendezvous) procFile(p int, kind string) string {
	return fmt.Sprintf("%s.p%d.%s", r.File, p, kind)
}

// A process's files: its hello (agree.go's session), that it is done
// (Close), its n-th agreement (agree.go), its status and its note of a
// failure (watch.go).
func (r *Rendezvous) helloFile(p int) string    { return r.procFile(p, "hello") }
func (r *Rendezvous) doneFile(p int) string     { return r.procFile(p, "done") }
func (r *Rendezvous) agreeFile(p, n int) string { return r.procFile(p, "agree"+strconv.Itoa(n)) }
func (r *Rendezvous) statusFile(p int) string   { return r.procFile(p, "status") }
func (r *Rendezvous) noteFile(p int) string     { return r.procFile(p, "failed") }
