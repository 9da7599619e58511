package launch

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"os"
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
	seq     int
	// agree.go's: agreements made, the run's tag, this process's hello,
	// and (rank 0) the FILE.run it last wrote
	agreed                int
	run, hello, announced string
}

// NewRendezvous checks that the run can meet: NCCL_COMM_ID is set, or file
// names a path in an existing folder (on a filesystem every node sees).
func NewRendezvous(l Launch, file string, timeout time.Duration) (*Rendezvous, error) {
	if file == "" && os.Getenv("NCCL_COMM_ID") == "" {
		return nil, fmt.Errorf("a run over %d processes (%s) needs --rendezvous FILE (a path on a filesystem every node sees, where rank 0 writes NCCL's unique id) or NCCL_COMM_ID=host:port (NCCL's own bootstrap)", l.World, l.Via)
	}
	if file != "" {
		dir := file[:strings.LastIndex("/"+file, "/")]
		if dir == "" {
			dir = "."
		}
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			return nil, fmt.Errorf("--rendezvous=%s: its folder %s does not exist", file, dir)
		}
	}
	return &Rendezvous{L: l, File: file, Timeout: timeout}, nil
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
		tmp := fmt.Sprintf("%s.tmp%d", r.File, os.Getpid())
		if err := os.WriteFile(tmp, []byte(want+"id "+hex.EncodeToString(id[:])+"\n"), 0o644); err != nil {
			return id, fmt.Errorf("--rendezvous: %w", err)
		}
		if err := os.Rename(tmp, r.File); err != nil {
			os.Remove(tmp)
			return id, fmt.Errorf("--rendezvous: %w", err)
		}
		return id, nil
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
	return fmt.Sprintf("moebench rendezvous 1\njob %q\nworld %d\nseq %d\n%s\n", r.L.Job, r.L.World, r.seq, r.run)
}

// read is the id in File when its header is want.
func (r *Rendezvous) read(want string) ([128]byte, bool) {
	var id [128]byte
	f, err := os.Open(r.File)
	if err != nil {
		return id, false
	}
	defer f.Close()
	var head strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if h, ok := strings.CutPrefix(line, "id "); ok {
			b, err := hex.DecodeString(h)
			if err != nil || len(b) != len(id) || head.String() != want {
				return id, false
			}
			copy(id[:], b)
			return id, true
		}
		head.WriteString(line + "\n")
	}
	return id, false
}

// Close removes the id file (rank 0, once the run is over).
func (r *Rendezvous) Close() {
	if r.File != "" && r.L.Rank == 0 {
		os.Remove(r.File)
		os.Remove(r.File + ".run")
	}
	if r.File != "" {
		os.Remove(fmt.Sprintf("%s.p%d.hello", r.File, r.L.Rank))
	}
}
