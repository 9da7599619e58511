package launch

import (
	"os"
	"path/filepath"
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
		os.WriteFile(file+".run", []byte(old+"\n"), 0o644)
		os.WriteFile(file+".p1.agree1", []byte(old+"\nunavailable\tstale\n"), 0o644)
		os.WriteFile(file+".p0.agree1", []byte(old+"\nfailed\tstale\n"), 0o644)
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
					all, err := r.Agree(v[p])
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
