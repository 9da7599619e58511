package device

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestThreadsEach: every device's f runs once per call, device 0's on the
// caller, the others on threads of their own, all at once (a device's f
// that waits for another's returns); errors come back joined in device
// order.
func TestThreadsEach(t *testing.T) {
	devs := []Device{&Emu{}, &Emu{}, &Emu{}}
	th := NewThreads(devs)
	defer th.Close()
	var ran [3]atomic.Int32
	arrived := make(chan int, 3)
	err := th.Each(func(dev int) error {
		ran[dev].Add(1)
		arrived <- dev
		for len(arrived) < 3 { // every device's f waits for the others: they run at once
		}
		return nil
	})
	if err != nil || ran[0].Load() != 1 || ran[1].Load() != 1 || ran[2].Load() != 1 {
		t.Fatalf("%v, ran %v %v %v", err, ran[0].Load(), ran[1].Load(), ran[2].Load())
	}
	err = th.Each(func(dev int) error {
		if dev == 0 {
			return nil
		}
		return fmt.Errorf("device %d failed", dev)
	})
	if err == nil || !strings.Contains(err.Error(), "device 1 failed\ndevice 2 failed") {
		t.Errorf("two failures: %v", err)
	}
	one := errors.New("only device 2")
	if err := th.Each(func(dev int) error {
		if dev == 2 {
			return one
		}
		return nil
	}); err != one {
		t.Errorf("one failure: %v", err)
	}
	if i := th.Of(devs[2]); i != 2 || th.Of(&Emu{}) != -1 {
		t.Errorf("Of: %d", i)
	}
}

// BenchmarkThreadsEach is the cost of one barrier across the devices'
// threads (a phase of a step pays one): an Each whose f does nothing.
//
//	go test -run '^$' -bench ThreadsEach ./kernels/device
func BenchmarkThreadsEach(b *testing.B) {
	for _, n := range []int{1, 2, 8} {
		b.Run(fmt.Sprintf("devices-%d", n), func(b *testing.B) {
			devs := make([]Device, n)
			for i := range devs {
				devs[i] = &Emu{}
			}
			th := NewThreads(devs)
			defer th.Close()
			f := func(int) error { return nil }
			b.ReportAllocs()
			for range b.N {
				th.Each(f)
			}
		})
	}
}

// TestThreadsHang: a device's call that never returns (a rank blocked in
// a collective that waits for one that never joins) ends the run once the
// limit passes, naming that device and what it was doing; a call that
// returns within its limit, even past the default one, is not cut.
func TestThreadsHang(t *testing.T) {
	th := NewThreads([]Device{&Emu{}, &Emu{}, &Emu{}})
	release := make(chan struct{})
	defer th.Close()
	hung := make(chan string, 1)
	th.Limit(200*time.Millisecond, func(dev int) string { return fmt.Sprintf("rank %d", dev) }, func(msg string) {
		hung <- msg
		close(release) // what exiting the process would end
	})
	th.Doing("compiling", time.Second) // a long setup call, within its own limit
	if err := th.Each(func(dev int) error { time.Sleep(400 * time.Millisecond); return nil }); err != nil {
		t.Fatal(err)
	}
	select {
	case msg := <-hung:
		t.Fatalf("a call within its limit was cut: %s", msg)
	default:
	}
	th.Doing("ncclCommInitRank", 0)
	start := time.Now()
	go th.Each(func(dev int) error {
		if dev == 1 { // the fake hook: rank 1 blocks
			<-release
		}
		return nil
	})
	var msg string
	select {
	case msg = <-hung:
	case <-time.After(5 * time.Second):
		t.Fatal("a call that never returns was waited for without limit")
	}
	if took := time.Since(start); took > 2*time.Second || !strings.Contains(msg, "rank 1 has not returned from ncclCommInitRank after 200ms") ||
		strings.Contains(msg, "rank 0") || strings.Contains(msg, "rank 2") {
		t.Errorf("after %v: %s", took, msg)
	}
}
