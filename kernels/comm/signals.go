package comm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/kernels/device"
)

// Signals is the host-mapped memory of one communicator of SM-driven
// kernels (moebench.cuh's mb_signals): an abort word, an error record per
// rank, which a kernel whose cross-rank wait gives up writes (mb_wait), and
// counters the kernels write and the host polls (DeepEP's received-token
// count). Per device of the ranks it also holds the claim words that elect
// the one thread of a rank that writes its record. Kernels get it as their
// mb_comm argument (Comm).
type Signals struct {
	ranks, counters int
	mem             device.MappedHost
	owner           device.Device   // the device mem was allocated through
	devs            []device.Device // each rank's
	claims          map[device.Device]device.Addr
	// Names, when set, names a phase and a wait of the kernels' numbering
	// (for errors); otherwise they are shown as numbers.
	Names func(phase, wait int) (phaseName, waitName string)
	// spin: WaitCounter spins first (a GPU: device.Hardware)
	spin bool
	// spins counts the polls WaitCounter spent spinning (yields, not
	// sleeps), for the tests
	spins atomic.Int64
}

// The layout of mb_signals and mb_error (moebench.cuh).
const (
	sigHeader   = 16 // abort, ranks, counters, pad
	errorRecord = 48 // status, rank, phase, wait, block, thread (int32); seen, expected (int64); waited_ns (uint64)
)

// NewSignals allocates the signals of a communicator whose rank r runs on
// devs[r] (ranks sharing a device share its claim words), with counters
// host-polled counters, all zero. The claim words are zeroed on
// streams[r] of each device's first rank (queued): the kernels that use
// them must come after it (launched there, or after a sync). A new
// allocation holds whatever the memory held (on a GPU, a freed buffer's
// bytes), and a claim word not zero keeps a rank that gives up from
// writing its record (seen on an H200: planted timeouts ended with no
// error).
func NewSignals(devs []device.Device, streams []device.Stream, counters int) (*Signals, error) {
	if len(devs) == 0 || counters < 0 || len(streams) != len(devs) {
		return nil, fmt.Errorf("signals for %d ranks (%d streams) and %d counters", len(devs), len(streams), counters)
	}
	s := &Signals{ranks: len(devs), counters: counters, owner: devs[0], devs: devs, claims: map[device.Device]device.Addr{},
		spin: device.Hardware(devs[0])}
	var err error
	if s.mem, err = devs[0].AllocMapped(int64(sigHeader + errorRecord*len(devs) + 4*counters)); err != nil {
		return nil, err
	}
	for _, d := range devs {
		if _, ok := s.claims[d]; ok {
			continue
		}
		p, err := d.Alloc(int64(4 * len(devs)))
		if err != nil {
			s.Free()
			return nil, err
		}
		s.claims[d] = p
	}
	s.clear()
	if err := s.zeroClaims(streams); err != nil {
		s.Free()
		return nil, err
	}
	return s, nil
}

// clear zeroes the host-mapped memory and writes the header.
func (s *Signals) clear() {
	b := unsafe.Slice((*byte)(s.mem.Host), s.mem.Bytes)
	for i := range b {
		b[i] = 0
	}
	atomic.StoreInt32(s.mem.Int32At(4), int32(s.ranks))
	atomic.StoreInt32(s.mem.Int32At(8), int32(s.counters))
}

// Reset makes the signals new again for the next launches: records,
// counters and the abort word now (no kernel may be using them), the claim
// words on streams[r] of each rank's device (queued).
func (s *Signals) Reset(streams []device.Stream) error {
	if len(streams) != s.ranks {
		return fmt.Errorf("signals reset with %d streams for %d ranks", len(streams), s.ranks)
	}
	s.clear()
	return s.zeroClaims(streams)
}

// zeroClaims queues the zeroing of each device's claim words on the
// stream of its first rank.
func (s *Signals) zeroClaims(streams []device.Stream) error {
	done := map[device.Device]bool{}
	for r, d := range s.devs {
		if done[d] {
			continue
		}
		done[d] = true
		if err := d.Fill16(s.claims[d], 0, int64(2*s.ranks), streams[r]); err != nil {
			return err
		}
	}
	return nil
}

// Free frees the signals' memory (no kernel may still use it).
func (s *Signals) Free() error {
	var first error
	for d, p := range s.claims {
		if err := d.Free(p); err != nil && first == nil {
			first = err
		}
	}
	s.claims = map[device.Device]device.Addr{}
	if s.mem.Host != nil {
		if err := s.owner.FreeMapped(s.mem); err != nil && first == nil {
			first = err
		}
		s.mem = device.MappedHost{}
	}
	return first
}

// Comm is the mb_comm kernel argument for launches on dev (one of the
// ranks' devices): the signals, dev's claim words and each wait's timeout.
func (s *Signals) Comm(dev device.Device, timeout time.Duration) cuda.Bytes {
	if _, ok := s.claims[dev]; !ok {
		panic("signals: Comm for a device that runs none of the ranks")
	}
	b := make(cuda.Bytes, 24)
	binary.LittleEndian.PutUint64(b, uint64(s.mem.Dev))
	binary.LittleEndian.PutUint64(b[8:], uint64(s.claims[dev]))
	binary.LittleEndian.PutUint64(b[16:], uint64(max(timeout, 0).Nanoseconds()))
	return b
}

// Counter reads counter i.
func (s *Signals) Counter(i int) int32 { return atomic.LoadInt32(s.counter(i)) }

// SetCounter writes counter i (no kernel may be writing it).
func (s *Signals) SetCounter(i int, v int32) { atomic.StoreInt32(s.counter(i), v) }

func (s *Signals) counter(i int) *int32 {
	if i < 0 || i >= s.counters {
		panic(fmt.Sprintf("signals: counter %d of %d", i, s.counters))
	}
	return s.mem.Int32At(int64(sigHeader + errorRecord*s.ranks + 4*i))
}

// Abort makes every kernel wait of the communicator give up (as the host
// does when its own wait expires).
func (s *Signals) Abort() { atomic.StoreInt32(s.mem.Int32At(0), 1) }

// WaitCounter polls counter i until done(value) holds and returns the
// value. It gives up early when a rank recorded an error (that error), and
// after timeout, when it aborts the kernels and returns a *HostWaitError
// naming what it waited for.
//
// On a GPU, for the first pollSpin of the wait it spins, yielding between
// polls, as DeepEP's host spins on its mapped counter; only a longer wait
// (a stalled kernel) sleeps, doubling to 1 ms. Sleeping from the start let
// the host see a count up to a millisecond late, and every later phase
// waited with it (Go rounds a sleep under 1 ms up to about 1 ms when no
// other thread wakes it: golang/go#44343). On a simulated device (Emu, the
// host simulation: device.Hardware false) it sleeps from the start: the
// spin only took a CPU from the simulated kernels.
func (s *Signals) WaitCounter(i int, what string, done func(int32) bool, timeout time.Duration) (int32, error) {
	start := time.Now()
	pause := 50 * time.Microsecond
	for {
		v := s.Counter(i)
		if done(v) {
			return v, nil
		}
		if err := s.Recorded(); err != nil {
			return v, err
		}
		waited := time.Since(start)
		if waited > timeout {
			s.Abort()
			return v, &HostWaitError{What: what, Counter: i, Seen: v, Waited: waited}
		}
		if s.spin && waited < pollSpin {
			s.spins.Add(1)
			runtime.Gosched()
			continue
		}
		time.Sleep(pause)
		pause = min(2*pause, time.Millisecond)
	}
}

// pollSpin: how long WaitCounter spins on a GPU before it sleeps (a count
// comes within it).
const pollSpin = 2 * time.Millisecond

// HostWaitError is the host's wait for a counter the kernels write that
// expired.
type HostWaitError struct {
	What    string
	Counter int
	Seen    int32
	Waited  time.Duration
}

func (e *HostWaitError) Error() string {
	return fmt.Sprintf("the host's wait for %s (counter %d) timed out after %v: it read %d", e.What, e.Counter, e.Waited.Round(time.Millisecond), e.Seen)
}

// CommRecord is one rank's error record: where its kernel gave up.
type CommRecord struct {
	Rank, Phase, Wait int
	PhaseName         string // from Signals.Names, else the number
	WaitName          string
	TimedOut          bool // its own wait expired (else it gave up after another rank, or the host)
	Check             bool // it read a value the protocol did not promise (mb_check): Seen, not Expected
	Block, Thread     int
	Seen, Expected    int64
	Waited            time.Duration
}

func (r CommRecord) String() string {
	what := "gave up (another rank or the host did)"
	switch {
	case r.TimedOut:
		what = "timed out"
	case r.Check:
		return fmt.Sprintf("rank %d failed a check in phase %s at wait %s: read %d, expected %d (block %d, thread %d)",
			r.Rank, r.PhaseName, r.WaitName, r.Seen, r.Expected, r.Block, r.Thread)
	}
	return fmt.Sprintf("rank %d %s in phase %s at wait %s after %v: read %d, waiting for %d (block %d, thread %d)",
		r.Rank, what, r.PhaseName, r.WaitName, r.Waited.Round(time.Microsecond), r.Seen, r.Expected, r.Block, r.Thread)
}

// ErrAbortedNoRecord: the communicator's abort word is set, and no rank
// recorded why (the host aborted the kernels, or a record was lost).
var ErrAbortedNoRecord = errors.New("cross-rank wait failed: the kernels were aborted and no rank recorded why (the host gave up on them, or a record was lost)")

// CommError is a collective whose kernels gave up on a cross-rank wait:
// every rank's record, those that timed out or failed a check first.
type CommError struct{ Records []CommRecord }

func (e *CommError) Error() string {
	parts := make([]string, len(e.Records))
	for i, r := range e.Records {
		parts[i] = r.String()
	}
	return "cross-rank wait failed: " + strings.Join(parts, "; ")
}

// Err returns the ranks' records as a *CommError, or nil when no kernel
// gave up, after synchronizing with the kernels: an abort word set with no
// record (the host aborted, or a record was lost) is an error too,
// ErrAbortedNoRecord, for the kernels' output is not whole. While kernels
// may still run, read Recorded instead.
func (s *Signals) Err() error {
	if err := s.Recorded(); err != nil {
		return err
	}
	if atomic.LoadInt32(s.mem.Int32At(0)) != 0 {
		return ErrAbortedNoRecord
	}
	return nil
}

// Recorded returns the records the ranks have written so far as a
// *CommError, or nil: safe while the kernels run (a record is whole once
// its status is set; the abort word may be seen before the record that
// goes with it).
func (s *Signals) Recorded() error {
	var timed, gave []CommRecord
	for r := range s.ranks {
		off := int64(sigHeader + errorRecord*r)
		status := atomic.LoadInt32(s.mem.Int32At(off))
		if status == 0 {
			continue
		}
		b := unsafe.Slice((*byte)(unsafe.Add(s.mem.Host, off)), errorRecord)
		i32 := func(k int) int { return int(int32(binary.LittleEndian.Uint32(b[4*k:]))) }
		rec := CommRecord{Rank: i32(1), Phase: i32(2), Wait: i32(3), Block: i32(4), Thread: i32(5), TimedOut: status == 1, Check: status == 3,
			Seen: int64(binary.LittleEndian.Uint64(b[24:])), Expected: int64(binary.LittleEndian.Uint64(b[32:])),
			Waited: time.Duration(binary.LittleEndian.Uint64(b[40:]))}
		rec.PhaseName, rec.WaitName = fmt.Sprint(rec.Phase), fmt.Sprint(rec.Wait)
		if s.Names != nil {
			rec.PhaseName, rec.WaitName = s.Names(rec.Phase, rec.Wait)
		}
		if rec.TimedOut || rec.Check {
			timed = append(timed, rec)
		} else {
			gave = append(gave, rec)
		}
	}
	if len(timed)+len(gave) == 0 {
		return nil
	}
	return &CommError{Records: append(timed, gave...)}
}
