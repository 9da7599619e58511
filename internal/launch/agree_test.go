package launch

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAgree: the processes' n-th agreements meet, each gets every
// process's verdict in process order, and the files a crashed earlier run
// left (its tag, a verdict for the same agreement) are never read as this
// run's, whichever process starts first.
func TestAgree(t *testing.T) {
	defer func(w time.Duration) { AgreeWait = w }(AgreeWait)
	AgreeWait = 3 * time.Second // a process that never gets the others' verdicts fails within the test's patience
	for _, late := range []int{0, 1} {
		file := filepath.Join(t.TempDir(), "rv")
		old := "run 0123 world 2 job \"\""
		os.WriteFile(file+".run", []byte(marker+" tag\n"+old+"\n"), 0o644)
		os.WriteFile(file+".p1.agree1", []byte(marker+" agreement\n"+old+"\nunavailable\tstale\n"), 0o644)
		os.WriteFile(file+".p0.agree1", []byte(old+"\nfailed\tstale\n"), 0o644) // as an older moebench left it
		verdicts := [][]Verdict{{{}, {"unavailable", "no NCCL"}}, {{}, {}}}
		type got struct {
			p   int
			all [][]Verdict
			err error
		}
		ch := make(chan got, 2)
		for p := range 2 {
			go func() {
				if p == late {
					time.Sleep(300 * time.Millisecond)
				}
				r := &Rendezvous{L: Launch{Rank: p, World: 2}, File: file, Timeout: time.Second}
				var g got
				g.p = p
				for _, v := range verdicts {
					all, err := r.Agree(v[p], nil)
					if err != nil {
						g.err = err
						break
					}
					g.all = append(g.all, all)
				}
				ch <- g
			}()
		}
		for range 2 {
			g := <-ch
			if g.err != nil || len(g.all) != 2 || g.all[0][0] != (Verdict{}) || g.all[0][1] != verdicts[0][1] || g.all[1][1] != (Verdict{}) {
				t.Errorf("process %d starting late: process %d got %+v, %v", late, g.p, g.all, g.err)
			}
		}
	}
}

// TestMeet: processes with the same settings meet; with different ones
// (a flag, or the launcher's number of processes) every process gets a
// *DifferError naming each that differs with each process's value; one
// that never arrives is named within Wait. A later Meet (a sweep's next
// point) repeats the refusal at once. After the processes close, the
// folder holds nothing of the run's.
func TestMeet(t *testing.T) {
	defer func(w time.Duration) { AgreeWait = w }(AgreeWait)
	AgreeWait = 3 * time.Second
	set := func(seed string) []Setting { return []Setting{{"--seed", seed}, {"--iters", "2"}} }
	for _, c := range []struct {
		name   string
		worlds [2]int // process 0's and 1's (0: not started)
		seeds  [2]string
		want   []string // in every started process's error; none: they meet
	}{
		{"same", [2]int{2, 2}, [2]string{"1", "1"}, nil},
		{"seed", [2]int{2, 2}, [2]string{"1", "7"}, []string{"--seed differs: process 0 has 1, process 1 has 7"}},
		{"world-2-4", [2]int{2, 4}, [2]string{"1", "1"}, []string{"MOEBENCH_WORLD differs: process 0 has 2, process 1 has 4"}},
		{"world-4-2", [2]int{4, 2}, [2]string{"1", "1"}, []string{"MOEBENCH_WORLD differs: process 0 has 4, process 1 has 2"}},
		{"never-started", [2]int{2, 0}, [2]string{"1", ""}, []string{"process 1 of 2 never arrived at --rendezvous", "within 1s (--rendezvous-timeout"}},
	} {
		dir := t.TempDir()
		file := filepath.Join(dir, "rv")
		errs := make(chan error, 2)
		started := 0
		for p := range 2 {
			if c.worlds[p] == 0 {
				continue
			}
			started++
			go func() {
				r, err := NewRendezvous(Launch{Rank: p, World: c.worlds[p], WorldVar: "MOEBENCH_WORLD"}, file, time.Second, time.Second)
				if err == nil {
					err = r.Meet(set(c.seeds[p]), nil)
					if err != nil { // a sweep's next point: the same refusal, at once
						start := time.Now()
						if again := r.Meet(set(c.seeds[p]), nil); again != err || time.Since(start) > 100*time.Millisecond {
							err = fmt.Errorf("the next Meet: %v after %v (the first: %v)", again, time.Since(start), err)
						}
					}
					r.Close()
				}
				errs <- err
			}()
		}
		for range started {
			err := <-errs
			if c.want == nil && err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
			for _, w := range c.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("%s: %v, want %q", c.name, err, w)
				}
			}
		}
		if left, _ := os.ReadDir(dir); c.name != "world-4-2" && len(left) > 0 {
			var names []string
			for _, e := range left {
				names = append(names, e.Name())
			}
			t.Errorf("%s: left %v", c.name, names)
		}
	}
}

// TestNotOurs: --rendezvous naming a file that is not a rendezvous file
// (a results file, anything else), or whose side files are not, is
// refused saying what it is; a rendezvous file an earlier run left is
// taken. Nothing is changed.
func TestNotOurs(t *testing.T) {
	dir := t.TempDir()
	l := Launch{Rank: 0, World: 2}
	for _, c := range []struct{ name, text, want string }{
		{"runs.jsonl", `{"schema":"moebench.record/v1","status":"ok"}` + "\n", "the path exists and is not a rendezvous file (it is a moebench results file (JSON lines, 46 bytes"},
		{"notes", "my notes\n", `not a rendezvous file (it is a file of 9 bytes that begins "my notes")`},
		{"empty", "", "(it is an empty file)"},
		{"old", marker + " id\njob \"\"\n", ""},
		{"old.p1.agree3", "run 0a1b world 2 job \"\"\n\t\n", "not a rendezvous file (it is"}, // FILE itself never in an older side file's form
	} {
		f := filepath.Join(dir, c.name)
		os.WriteFile(f, []byte(c.text), 0o644)
		_, err := NewRendezvous(l, f, time.Second, 0)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), "--rendezvous="+f+": ") || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
		if b, _ := os.ReadFile(f); string(b) != c.text {
			t.Errorf("%s: changed to %q", c.name, b)
		}
	}
	f := filepath.Join(dir, "rv")
	os.WriteFile(f+".run", []byte("a user's file\n"), 0o644)
	if _, err := NewRendezvous(l, f, time.Second, 0); err == nil || !strings.Contains(err.Error(), f+".run exists and is not a rendezvous file") {
		t.Errorf("FILE.run not ours: %v", err)
	}
	if _, err := NewRendezvous(l, f, time.Second, 100*time.Millisecond); err == nil || !strings.Contains(err.Error(), "--rendezvous-timeout=100ms: must be in [1s, 1h]") {
		t.Errorf("--rendezvous-timeout 100ms: %v", err)
	}
}

// TestIDAndClose: after the processes met, rank 0's NCCL id reaches the
// other through FILE (a stale id of another run is not taken), and once
// both closed the folder holds nothing.
func TestIDAndClose(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "rv")
	os.WriteFile(file, []byte(marker+" id\njob \"\"\nworld 2\nseq 1\nrun stale\nid "+strings.Repeat("ab", 128)+"\n"), 0o644)
	ids := make(chan [128]byte, 2)
	errs := make(chan error, 2)
	for p := range 2 {
		go func() {
			r, err := NewRendezvous(Launch{Rank: p, World: 2}, file, 5*time.Second, time.Second)
			if err == nil {
				err = r.Meet([]Setting{{"--seed", "1"}}, nil)
			}
			if err == nil {
				var id [128]byte
				id, err = r.ID(func() ([128]byte, error) { return [128]byte{7, 8, 9}, nil })
				ids <- id
			}
			if r != nil {
				r.Close()
			}
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
		if id := <-ids; id != [128]byte{7, 8, 9} {
			t.Errorf("id %x", id[:4])
		}
	}
	if left, _ := os.ReadDir(dir); len(left) > 0 {
		t.Errorf("left %v", left)
	}
}
