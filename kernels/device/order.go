package device

import (
	"fmt"
	"slices"
	"sync"
	"unsafe"
)

// Emu's stream-order check. A GPU runs the work of different streams at
// the same time unless events order it, while Emu runs every call at once,
// in the order queued; a pipeline that forgets a Wait therefore computes the
// right numbers on Emu and wrong ones, some of the time, on a GPU. So Emu
// checks each call's memory accesses against the order CUDA guarantees:
//
//   - the work of one stream runs in the order queued;
//   - work queued on s after Wait(s, e) runs after the work queued before
//     e's Record, on e's stream (and, transitively, what that work waited for);
//   - work queued after the host returns from SyncStream(s) or Download on s
//     runs after everything queued on s before (and what it waited for);
//   - an emulated NCCL receive runs after the send's stream work queued before it.
//
// Two accesses to overlapping bytes from different streams, at least one
// a write, that this order does not place one after the other are a race:
// the call that makes the second fails, naming both. So does freeing memory
// that queued work the host has not waited for may still use, and reading
// the elapsed time of an event the host has not waited for (CUDA says "not
// ready"). Internal copies (a nil stream) are part of the call that makes
// them and are not checked on their own.
//
// Streams keep vector clocks: a stream's clock counts the accesses queued on
// it, and knows, for each other stream, how far its work is ordered before
// this stream's next call. The host's knowledge is one map for every stream
// (what it has waited for is done for every later call, whatever the
// stream), so it is kept for the whole process; accesses it covers are
// dropped from the allocations' records.

// order is the process's stream-order state, shared by every Emu (streams
// of different Emus order each other through events, copies and receives).
var order = struct {
	sync.Mutex
	streams int32            // streams made so far (ids from 1)
	done    map[int32]uint32 // per stream: accesses the host has waited for
}{done: map[int32]uint32{}}

// VectorClock is a stream's position: the access count of each stream it is
// ordered after (its own included).
type VectorClock map[int32]uint32

// join raises c to at least o, entry by entry.
func (c VectorClock) join(o VectorClock) {
	for id, n := range o {
		if n > c[id] {
			c[id] = n
		}
	}
}

// access is one call's access to bytes [lo, hi) of an allocation.
type access struct {
	lo, hi Addr
	stream int32
	at     uint32 // the stream's count at this access
	write  bool
	op     string
}

// span is a range a call reads or writes, on e's memory.
type span struct {
	e     *Emu
	p     Addr
	n     int64
	write bool
}

func (e *Emu) ReadSpan(p Addr, n int64) span  { return span{e, p, n, false} }
func (e *Emu) WriteSpan(p Addr, n int64) span { return span{e, p, n, true} }

// newStreamID hands out a stream id.
func newStreamID() int32 {
	order.Lock()
	defer order.Unlock()
	order.streams++
	return order.streams
}

// waited reports whether the host has waited for access a (order locked).
func (a access) waited() bool { return a.at <= order.done[a.stream] }

// ordered reports whether access a is ordered before work on a stream at
// position c (order locked).
func ordered(a access, c VectorClock) bool { return a.at <= c[a.stream] || a.waited() }

// Enqueue checks the accesses of one call on s (nil: an internal copy, not
// checked) against the stream order and records them. It checks every
// span before recording any, so a call that fails records nothing.
func (e *Emu) Enqueue(op string, s Stream, spans ...span) error {
	if s == nil {
		return nil
	}
	if err := e.TakeStream(s); err != nil {
		return err
	}
	return e.record(op, s, spans...)
}

// record is queue without waiting for a pending collective launch on s: a
// twin's accesses, made while its launch is the one pending.
func (e *Emu) record(op string, s Stream, spans ...span) error {
	st := (*emuStream)(unsafe.Pointer(s))
	order.Lock()
	defer order.Unlock()
	c := st.clock
	allocs := make([]*emuAlloc, len(spans)) // nil: a span of no bytes
	for i, sp := range spans {
		if sp.n <= 0 || sp.p == 0 {
			continue
		}
		a, err := sp.e.alloc(sp.p, sp.n)
		if err != nil {
			return fmt.Errorf("emu: %s: %w", op, err)
		}
		allocs[i] = a
		for _, o := range a.acc {
			if o.stream == st.id || (!o.write && !sp.write) || o.hi <= sp.p || sp.p+Addr(sp.n) <= o.lo || ordered(o, c) {
				continue
			}
			return fmt.Errorf("emu: stream order: %s on stream %d %s [%#x, +%d bytes), which %s on stream %d %s, and no event or host wait orders the two (on a GPU they may overlap)",
				op, st.id, verb(sp.write), uint64(sp.p), sp.n, o.op, o.stream, verb(o.write)+"s")
		}
	}
	c[st.id]++
	for i, sp := range spans {
		a := allocs[i]
		if a == nil {
			continue
		}
		if len(a.acc) >= 64 { // drop what the host has waited for
			a.acc = slices.DeleteFunc(a.acc, access.waited)
		}
		a.acc = append(a.acc, access{sp.p, sp.p + Addr(sp.n), st.id, c[st.id], sp.write, op})
	}
	return nil
}

func verb(write bool) string {
	if write {
		return "write"
	}
	return "read"
}

// hostWaited records that the host has waited for the work queued on s.
func hostWaited(s Stream) {
	if s == nil {
		return
	}
	order.Lock()
	defer order.Unlock()
	for id, n := range (*emuStream)(unsafe.Pointer(s)).clock {
		order.done[id] = max(order.done[id], n)
	}
}

// pending names an access to a that the host has not waited for, or "".
func (a *emuAlloc) pending() string {
	order.Lock()
	defer order.Unlock()
	for _, o := range a.acc {
		if !o.waited() {
			return fmt.Sprintf("%s on stream %d", o.op, o.stream)
		}
	}
	return ""
}

// recordEvent makes v stand for the work queued on s so far.
func recordEvent(v *emuEvent, s *emuStream) {
	order.Lock()
	defer order.Unlock()
	v.clock = VectorClock{}
	v.clock.join(s.clock)
	v.stream = s.id
}

// OrderAfter orders the work queued on s from now on after the work c
// stands for (an event's clock: a Wait; a sending stream's: a receive).
func OrderAfter(s Stream, c VectorClock) {
	order.Lock()
	defer order.Unlock()
	(*emuStream)(unsafe.Pointer(s)).clock.join(c)
}

// StreamClock is a copy of s's clock: what its work queued so far stands
// for.
func StreamClock(s Stream) VectorClock {
	order.Lock()
	defer order.Unlock()
	c := VectorClock{}
	c.join((*emuStream)(unsafe.Pointer(s)).clock)
	return c
}

// eventDone reports whether the host has waited for v's work.
func eventDone(v *emuEvent) bool {
	order.Lock()
	defer order.Unlock()
	return v.clock[v.stream] <= order.done[v.stream]
}
