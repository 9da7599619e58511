package comm

import (
	"errors"
	"strings"
	"testing"

	"github.com/moebench/moebench/kernels/device"
)

// orderRig is two Emus (two GPUs) with two streams each and a buffer on
// each, for the stream-order check's cases.
type orderRig struct {
	t          *testing.T
	a, b       *device.Emu
	a1, a2, b1 device.Stream
	pa, pb     device.Addr // 1 KiB each, on a and b
	ev, ev0    device.Event
	evB        device.Event // b's
}

// elapsed is the time from ev0 to ev.
func (r *orderRig) elapsed() error {
	_, err := r.a.Elapsed(r.ev0, r.ev)
	return err
}

// send sends n bytes from rank 0 (a, stream a1) to rank 1 (b, stream b1)
// through the emulated communicator.
func (r *orderRig) send(src, dst device.Addr, n int64) error {
	th := device.NewThreads([]device.Device{r.a, r.b})
	defer th.Close()
	c, err := OpenComm(th, []device.Device{r.a, r.b}, []device.Stream{r.a1, r.b1})
	if err != nil {
		return err
	}
	if err := c.Exchange(0, []PeerTransfer{{Peer: 1, Buf: src, Bytes: n}}, nil); err != nil { // the send first: Emu's receive waits for it
		return err
	}
	return c.Exchange(1, nil, []PeerTransfer{{Peer: 0, Buf: dst, Bytes: n}})
}

func newOrderRig(t *testing.T) *orderRig {
	r := &orderRig{t: t, a: &device.Emu{}, b: &device.Emu{}}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	var err error
	r.a1, err = r.a.NewStream()
	must(err)
	r.a2, err = r.a.NewStream()
	must(err)
	r.b1, err = r.b.NewStream()
	must(err)
	r.pa, err = r.a.Alloc(1024)
	must(err)
	r.pb, err = r.b.Alloc(1024)
	must(err)
	r.ev, err = r.a.NewEvent()
	must(err)
	r.ev0, err = r.a.NewEvent()
	must(err)
	r.evB, err = r.b.NewEvent()
	must(err)
	must(r.a.Fill16(r.pa, 1, 512, r.a1))
	must(r.a.SyncStream(r.a1))
	return r
}

// TestStreamOrder: Emu refuses an access that no event or host wait orders
// after a conflicting access of another stream, and accepts every ordered
// or non-conflicting one.
func TestStreamOrder(t *testing.T) {
	cases := []struct {
		name string
		race bool
		run  func(r *orderRig) error
	}{
		{"write then read on another stream", true, func(r *orderRig) error {
			return errors.Join(
				r.a.Fill16(r.pa, 2, 8, r.a1),
				r.a.Copy(r.pa+512, r.pa, 16, r.a2),
			)
		}},
		{"read then write on another stream", true, func(r *orderRig) error {
			return errors.Join(
				r.a.Copy(r.pa+512, r.pa, 16, r.a1),
				r.a.Fill16(r.pa, 2, 8, r.a2),
			)
		}},
		{"two writes", true, func(r *orderRig) error {
			return errors.Join(
				r.a.Fill16(r.pa+8, 2, 8, r.a1),
				r.a.Fill16(r.pa, 3, 8, r.a2),
			)
		}},
		{"record after the write, wait", false, func(r *orderRig) error {
			return errors.Join(
				r.a.Fill16(r.pa, 2, 8, r.a1),
				r.a.Record(r.ev, r.a1),
				r.a.Wait(r.a2, r.ev),
				r.a.Copy(r.pa+512, r.pa, 16, r.a2),
			)
		}},
		{"record before the write", true, func(r *orderRig) error {
			return errors.Join(
				r.a.Record(r.ev, r.a1),
				r.a.Fill16(r.pa, 2, 8, r.a1),
				r.a.Wait(r.a2, r.ev),
				r.a.Copy(r.pa+512, r.pa, 16, r.a2),
			)
		}},
		{"host waits for the writer", false, func(r *orderRig) error {
			return errors.Join(
				r.a.Fill16(r.pa, 2, 8, r.a1),
				r.a.SyncStream(r.a1),
				r.a.Copy(r.pa+512, r.pa, 16, r.a2),
			)
		}},
		{"host waits for the wrong stream", true, func(r *orderRig) error {
			return errors.Join(
				r.a.Fill16(r.pa, 2, 8, r.a1),
				r.a.SyncStream(r.a2),
				r.a.Copy(r.pa+512, r.pa, 16, r.a2),
			)
		}},
		{"download waits", false, func(r *orderRig) error {
			return errors.Join(
				r.a.Fill16(r.pa, 2, 8, r.a1),
				r.a.Download(make([]uint16, 1), r.pa+1000, r.a1),
				r.a.Fill16(r.pa, 3, 8, r.a2),
			)
		}},
		{"two reads", false, func(r *orderRig) error {
			return errors.Join(
				r.a.Copy(r.pa+512, r.pa, 16, r.a1),
				r.a.Copy(r.pa+600, r.pa, 16, r.a2),
			)
		}},
		{"disjoint writes", false, func(r *orderRig) error {
			return errors.Join(
				r.a.Fill16(r.pa, 2, 8, r.a1),
				r.a.Fill16(r.pa+16, 3, 8, r.a2),
			)
		}},
		{"through a third stream, on another GPU", false, func(r *orderRig) error {
			return errors.Join(
				r.a.Fill16(r.pa, 2, 8, r.a1),
				r.a.Record(r.ev, r.a1),
				r.b.Wait(r.b1, r.ev),
				r.b.CopyPeer(device.CopyOp{Dst: r.pb, Src: r.pa + 512, Bytes: 16, SrcDev: r.a}, r.b1),
				r.b.Record(r.evB, r.b1),
				r.a.Wait(r.a2, r.evB),
				r.a.Copy(r.pa+512, r.pa, 16, r.a2),
			)
		}},
		{"peer copy with no wait", true, func(r *orderRig) error {
			return errors.Join(
				r.a.Fill16(r.pa, 2, 8, r.a1),
				r.b.CopyPeer(device.CopyOp{Dst: r.pb, Src: r.pa, Bytes: 16, SrcDev: r.a}, r.b1),
			)
		}},
		{"a kernel's gather, unordered", true, func(r *orderRig) error {
			return errors.Join(
				r.a.Upload(r.pa+256, []int32{3, 1}, r.a1), // rows 3 and 1 of 8 bf16 each
				r.a.SyncStream(r.a1),
				r.a.Fill16(r.pa+16*2, 2, 8, r.a2), // row 2: inside the rows read
				r.a.GatherRows(r.pa+512, r.pa, r.pa+256, 1, 2, 8, r.a1),
			)
		}},
		{"a kernel's gather, past the rows read", false, func(r *orderRig) error {
			return errors.Join(
				r.a.Upload(r.pa+256, []int32{3, 1}, r.a1),
				r.a.SyncStream(r.a1),
				r.a.Fill16(r.pa+16*4, 2, 8, r.a2), // row 4
				r.a.GatherRows(r.pa+512, r.pa, r.pa+256, 1, 2, 8, r.a1),
			)
		}},
		{"free of memory in use", true, func(r *orderRig) error {
			return errors.Join(
				r.a.Fill16(r.pa, 2, 8, r.a2),
				r.a.Free(r.pa),
			)
		}},
		{"free after the host waits", false, func(r *orderRig) error {
			return errors.Join(
				r.a.Fill16(r.pa, 2, 8, r.a2),
				r.a.SyncStream(r.a2),
				r.a.Free(r.pa),
			)
		}},
		{"elapsed time before the host waits", true, func(r *orderRig) error {
			return errors.Join(
				r.a.Record(r.ev0, r.a1),
				r.a.Fill16(r.pa, 2, 8, r.a1),
				r.a.Record(r.ev, r.a1),
				r.elapsed(),
			)
		}},
		{"elapsed time after", false, func(r *orderRig) error {
			return errors.Join(
				r.a.Record(r.ev0, r.a1),
				r.a.Fill16(r.pa, 2, 8, r.a1),
				r.a.Record(r.ev, r.a1),
				r.a.SyncStream(r.a1),
				r.elapsed(),
			)
		}},
		{"a receive after its send, then the receiver reads", false, func(r *orderRig) error {
			return errors.Join(
				r.a.Fill16(r.pa, 2, 8, r.a1),
				r.send(r.pa, r.pb, 16),
				r.b.Copy(r.pb+512, r.pb, 16, r.b1),
			)
		}},
		{"a send of data another stream writes", true, func(r *orderRig) error {
			return errors.Join(
				r.a.Fill16(r.pa, 2, 8, r.a2),
				r.send(r.pa, r.pb, 16),
			)
		}},
	}
	// a stream of another GPU is refused before any order is checked
	r := newOrderRig(t)
	for name, err := range map[string]error{
		"upload":   r.a.Upload(r.pa, []int32{1}, r.b1),
		"download": r.a.Download(make([]int32, 1), r.pa, r.b1),
		"copy":     r.a.Copy(r.pa+512, r.pa, 16, r.b1),
		"kernel":   r.a.SwiGLU(r.pa+512, r.pa, 0, 1, 8, r.b1),
	} {
		if err == nil || !strings.Contains(err.Error(), "a stream of another device") {
			t.Errorf("%s on another GPU's stream: %v", name, err)
		}
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.run(newOrderRig(t))
			switch {
			case c.race && (err == nil || !strings.Contains(err.Error(), "stream order")):
				t.Errorf("want a stream-order error, got %v", err)
			case !c.race && err != nil:
				t.Errorf("refused: %v", err)
			}
		})
	}
}

// TestEmuElapsedAsTheDriver: Emu answers the elapsed time of events as the
// driver does: an event never recorded is CUDA_ERROR_INVALID_HANDLE (either
// end), one whose work the host has not waited for is not ready, and two
// recorded and waited for give a time.
func TestEmuElapsedAsTheDriver(t *testing.T) {
	r := newOrderRig(t)
	never, err := r.a.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.a.Record(r.ev0, r.a1); err != nil {
		t.Fatal(err)
	}
	if err := r.a.Fill16(r.pa, 2, 512, r.a1); err != nil {
		t.Fatal(err)
	}
	if err := r.a.Record(r.ev, r.a1); err != nil {
		t.Fatal(err)
	}
	if err := r.elapsed(); err == nil || !strings.Contains(err.Error(), "not ready") {
		t.Errorf("before the host waited: %v, want not ready", err)
	}
	if err := r.a.SyncStream(r.a1); err != nil {
		t.Fatal(err)
	}
	for name, p := range map[string][2]device.Event{"start": {never, r.ev}, "end": {r.ev0, never}} {
		if _, err := r.a.Elapsed(p[0], p[1]); err == nil || !strings.Contains(err.Error(), "CUDA_ERROR_INVALID_HANDLE") {
			t.Errorf("%s never recorded: %v, want CUDA_ERROR_INVALID_HANDLE", name, err)
		}
	}
	if err := r.elapsed(); err != nil {
		t.Errorf("both recorded and waited for: %v", err)
	}
}
