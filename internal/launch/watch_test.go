package launch

import (
	"strings"
	"testing"
	"time"
)

// TestWatchUnmet: without a rendezvous file (NCCL_COMM_ID alone) a process
// that waits past the timeout in the meeting (NCCL's communicator setup)
// stops saying that its ranks joined and which processes' did not: the
// other one of two, named with its ranks; of more, every other as a
// candidate, with --rendezvous suggested. After the meeting the only other
// process of two is named as failed or hung; Unmet says nothing outside
// the meeting.
func TestWatchUnmet(t *testing.T) {
	t.Setenv("NCCL_COMM_ID", "10.0.0.1:29501")
	for _, c := range []struct {
		rank, world, per int
		meeting          bool
		want             []string
	}{
		{1, 2, 2, true, []string{"ranks 2–3 (process 1 of 2 on n) waited 300ms in NCCL's setup for the other processes (--comm-timeout): this process's ranks joined NCCL's communicator setup at NCCL_COMM_ID=10.0.0.1:29501",
			"process 0 (ranks 0–1), the run's only other process, never joined it"}},
		{0, 3, 1, true, []string{"of process 1 (rank 1), process 2 (rank 2), one or more never joined it", "NCCL's bootstrap does not say which", "--rendezvous FILE"}},
		{0, 2, 4, false, []string{"waited 300ms in dispatch", "process 1 (ranks 4–7), the run's only other process, failed, was killed or hangs"}},
		{2, 4, 2, false, []string{"one of process 0 (ranks 0–1), process 1 (ranks 2–3), process 3 (ranks 6–7) failed, was killed or hangs", "--rendezvous FILE"}},
	} {
		r := &Rendezvous{L: Launch{Rank: c.rank, World: c.world, Host: "n"}, Timeout: 300 * time.Millisecond}
		exited := make(chan string, 1)
		w := r.Watch([128]byte{1}, Describe(c.rank*c.per, (c.rank+1)*c.per-1, c.rank, c.world, "n"), c.per)
		w.Exit = func(msg string) { exited <- msg }
		if c.meeting {
			w.Meeting("NCCL's setup")
			if u := w.Unmet(); !strings.Contains(u, "never joined it") {
				t.Errorf("rank %d of %d: Unmet in the meeting: %q", c.rank, c.world, u)
			}
		} else {
			w.Stage("dispatch")
			if u := w.Unmet(); u != "" {
				t.Errorf("rank %d of %d: Unmet after the meeting: %q", c.rank, c.world, u)
			}
		}
		select {
		case msg := <-exited:
			for _, s := range c.want {
				if !strings.Contains(msg, s) {
					t.Errorf("rank %d of %d: %q lacks %q", c.rank, c.world, msg, s)
				}
			}
		case <-time.After(5 * time.Second):
			t.Errorf("rank %d of %d: no stop 5 s after a timeout of 300 ms", c.rank, c.world)
		}
		w.Stop()
	}
}
