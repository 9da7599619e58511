package kernels

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
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
//	go test -run '^$' -bench ThreadsEach ./kernels
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
