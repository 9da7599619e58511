package device

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
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

	// the limit on a call of Each (Limit, Doing): a hung call — a rank's
	// collective that waits for one that never comes — cannot be
	// interrupted, so the watchdog ends the run, naming it
	mu       sync.Mutex
	limit    time.Duration // of the calls Doing names; 0: none
	doing    string
	doingFor time.Duration // Doing's limit; 0: limit
	onHang   func(msg string)
	name     func(dev int) string
	returned []atomic.Bool // each device's f of the current call returned
	since    atomic.Int64  // unix ns the current call began; 0: none
	stop     chan struct{}
}

// NewThreads starts the threads of devs (distinct devices) but the first.
func NewThreads(devs []Device) *Threads {
	n := len(devs)
	t := &Threads{devs: devs, start: make([]chan struct{}, max(n-1, 0)), errs: make([]error, n), returned: make([]atomic.Bool, n)}
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
		t.returned[i].Store(true)
		t.wg.Done()
	}
}

// Limit makes every later call of Each that takes longer than its limit
// (Doing's, else d) end the run: onHang gets a message naming the devices
// (name(dev), or "device N") whose f has not returned and what they do
// (Doing); nil onHang prints it and exits with status 1 — a call that
// never returns (a C call into the driver or a collective library) cannot
// be interrupted, and waiting for it would hang the run. d ≤ 0: no limit.
func (t *Threads) Limit(d time.Duration, name func(dev int) string, onHang func(msg string)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.limit, t.name, t.onHang = d, name, onHang
	if t.onHang == nil {
		t.onHang = func(msg string) {
			fmt.Fprintf(os.Stderr, "moebench: %s\n", msg)
			os.Exit(1)
		}
	}
	if t.stop == nil && d > 0 {
		t.stop = make(chan struct{})
		go t.watchdog(t.stop)
	}
}

// Doing names what the next calls of Each do, and how long each may take
// (d ≤ 0: Limit's): a setup step that compiles kernels may take minutes,
// a timed step's phase seconds.
func (t *Threads) Doing(s string, d time.Duration) {
	t.mu.Lock()
	t.doing, t.doingFor = s, d
	t.mu.Unlock()
}

// watchdog checks the current call of Each against its limit.
func (t *Threads) watchdog(stop chan struct{}) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		since := t.since.Load()
		t.mu.Lock()
		doing, limit, name, onHang := t.doing, t.limit, t.name, t.onHang
		if t.doingFor > 0 && limit > 0 {
			limit = t.doingFor
		}
		t.mu.Unlock()
		if since == 0 || limit <= 0 || time.Since(time.Unix(0, since)) < limit {
			continue
		}
		var hung []string
		for i := range t.returned {
			if !t.returned[i].Load() {
				if name != nil {
					hung = append(hung, name(i))
				} else {
					hung = append(hung, fmt.Sprintf("device %d", i))
				}
			}
		}
		if len(hung) == 0 || t.since.Load() != since { // it returned meanwhile
			continue
		}
		if doing == "" {
			doing = "a call on every device's thread"
		}
		onHang(fmt.Sprintf("%s has not returned from %s after %v (a collective call waiting for a rank that never joins, or a hung GPU): the run stops rather than hang",
			strings.Join(hung, ", "), doing, limit))
		return
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
	for i := range t.returned {
		t.returned[i].Store(false)
	}
	t.since.Store(time.Now().UnixNano())
	t.wg.Add(len(t.start))
	for _, c := range t.start {
		c <- struct{}{}
	}
	t.errs[0] = f(0)
	t.returned[0].Store(true)
	t.wg.Wait()
	t.since.Store(0)
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

// Close ends the threads (their work is done: Each has returned) and the
// watchdog.
func (t *Threads) Close() {
	for _, c := range t.start {
		close(c)
	}
	t.mu.Lock()
	if t.stop != nil {
		close(t.stop)
		t.stop = nil
	}
	t.mu.Unlock()
}
