package kernels

import (
	"errors"
	"runtime"
	"sync"
)

// Threads issue the work of a run's devices, each device's from an OS
// thread of its own, all devices at once: device 0's from the calling
// goroutine's (which the CUDA binding locks to its thread when it makes a
// context current), the others' from goroutines locked to theirs. The CUDA
// driver's current context is per thread, and collective libraries
// (NCCL's communicator setup, NCCL EP's group creation, handle update and
// dispatch) block a rank's calling thread until every rank has called:
// one thread driving every GPU would deadlock, and a thread per GPU also
// spreads the host's issue cost over the cores. Ranks packed onto one
// device are issued by its thread in turn (they share the device's
// objects, which are not safe for concurrent use).
type Threads struct {
	devs  []Device
	start []chan struct{} // devices 1…n−1
	f     func(dev int) error
	errs  []error
	wg    sync.WaitGroup
}

// NewThreads starts the threads of devs (distinct devices) but the first.
func NewThreads(devs []Device) *Threads {
	n := len(devs)
	t := &Threads{devs: devs, start: make([]chan struct{}, max(n-1, 0)), errs: make([]error, n)}
	for i := range t.start {
		t.start[i] = make(chan struct{})
		go t.lane(i + 1)
	}
	return t
}

// lane runs device i's work on an OS thread that nothing else uses; the
// thread ends with it (never unlocked), taking its current context along.
func (t *Threads) lane(i int) {
	runtime.LockOSThread()
	for range t.start[i-1] {
		t.errs[i] = t.f(i)
		t.wg.Done()
	}
}

// Devices are the devices, one per thread, in thread order.
func (t *Threads) Devices() []Device { return t.devs }

// Of is the index of d's thread, or −1.
func (t *Threads) Of(d Device) int {
	for i, x := range t.devs {
		if x == d {
			return i
		}
	}
	return -1
}

// Each runs f(dev) for every device at once, device 0's on the calling
// goroutine, and returns when all have returned (a barrier): nil, or their
// errors joined in device order. f must not call Each. It allocates
// nothing itself, so a caller that keeps its f issues a step without
// allocating.
func (t *Threads) Each(f func(dev int) error) error {
	if len(t.devs) == 0 {
		return nil
	}
	t.f = f
	t.wg.Add(len(t.start))
	for _, c := range t.start {
		c <- struct{}{}
	}
	t.errs[0] = f(0)
	t.wg.Wait()
	t.f = nil
	var first error
	n := 0
	for _, err := range t.errs {
		if err != nil {
			first, n = err, n+1
		}
	}
	if n <= 1 {
		clear(t.errs)
		return first
	}
	err := errors.Join(t.errs...)
	clear(t.errs)
	return err
}

// Close ends the threads (their work is done: Each has returned).
func (t *Threads) Close() {
	for _, c := range t.start {
		close(c)
	}
}
