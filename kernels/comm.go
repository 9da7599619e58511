package kernels

import (
	"cmp"
	"errors"
	"fmt"
	"unsafe"

	"github.com/moebench/moebench/internal/cuda"
)

// Comm is a communicator over the ranks of a run, one rank per device: it
// moves data between ranks with grouped point-to-point transfers (NCCL on
// CUDA), each side on its rank's stream.
type Comm interface {
	// Name says what moves the data, with its version.
	Name() string
	// Exchange queues xs as one group: each transfer's send on its source
	// rank's stream, its receive on its destination's. Transfers of no
	// bytes are skipped; the rest of a rank's stream's work keeps its
	// order around them.
	Exchange(xs []Xfer) error
	Close() error
}

// Xfer is one transfer of a group: Bytes from rank From's Src to rank To's
// Dst (From and To may be the same rank).
type Xfer struct {
	From, To int
	Src, Dst Ptr
	Bytes    int64
}

// checkRanks: every transfer is between ranks of n, of no negative size.
func checkRanks(xs []Xfer, n int) error {
	for _, x := range xs {
		if x.From < 0 || x.From >= n || x.To < 0 || x.To >= n || x.Bytes < 0 {
			return fmt.Errorf("a transfer of %d bytes from rank %d to rank %d of %d", x.Bytes, x.From, x.To, n)
		}
	}
	return nil
}

// NoCommError says why a communicator cannot be had on these devices (an
// environment limitation: no library, ranks sharing a device).
type NoCommError struct{ Reason string }

func (e *NoCommError) Error() string { return e.Reason }

// OpenComm makes a communicator over devs, rank r on devs[r] with its work
// on streams[r]: NCCL when every device is a GPU, an emulated one over Emu
// devices (for tests). NCCL needs one GPU per rank.
func OpenComm(devs []Device, streams []Stream) (Comm, error) {
	if len(devs) == 0 || len(devs) != len(streams) {
		return nil, fmt.Errorf("a communicator over %d devices with %d streams", len(devs), len(streams))
	}
	for a := range devs {
		for b := range a {
			if devs[a] == devs[b] {
				return nil, &NoCommError{fmt.Sprintf("ranks %d and %d share a device, and a communicator needs one device per rank (NCCL refuses a GPU twice)", b, a)}
			}
		}
	}
	if _, ok := devs[0].(emuBacked); ok {
		return openEmuComm(devs, streams)
	}
	ords := make([]int, len(devs))
	for r, d := range devs {
		g, ok := d.(*CUDA)
		if !ok {
			return nil, &NoCommError{fmt.Sprintf("rank %d's device is %s: NCCL needs GPUs", r, d.Name())}
		}
		ords[r] = g.Ordinal
	}
	lib, err := cuda.OpenNCCL()
	if err != nil {
		return nil, &NoCommError{err.Error()}
	}
	drv := devs[0].(*CUDA).Drv
	comms, err := lib.InitAll(ords)
	drv.ContextChanged()
	if err != nil {
		return nil, err
	}
	return &ncclComm{lib: lib, comms: comms, drv: drv, streams: streams}, nil
}

// ncclComm is a Comm over GPUs of one process: one NCCL communicator per GPU
// (ncclCommInitAll), each group of transfers in one ncclGroupStart/End.
type ncclComm struct {
	lib     *cuda.NCCL
	comms   []cuda.Comm
	drv     *cuda.Driver // the GPUs' (NCCL changes its current context)
	streams []Stream
}

func (n *ncclComm) Name() string { return "NCCL " + n.lib.Version + " (grouped ncclSend/ncclRecv)" }

// Exchange checks every transfer before the group starts: a send whose
// receive is never posted would hang the GPUs, not fail.
func (n *ncclComm) Exchange(xs []Xfer) error {
	if err := checkRanks(xs, len(n.comms)); err != nil {
		return err
	}
	if err := n.lib.GroupStart(); err != nil {
		return err
	}
	var errs []error
	for _, x := range xs {
		if x.Bytes == 0 {
			continue
		}
		if err := n.lib.Send(x.Src, x.Bytes, x.To, n.comms[x.From], n.streams[x.From]); err != nil {
			errs = append(errs, err)
			break
		}
		if err := n.lib.Recv(x.Dst, x.Bytes, x.From, n.comms[x.To], n.streams[x.To]); err != nil {
			errs = append(errs, err)
			break
		}
	}
	errs = append(errs, n.lib.GroupEnd()) // a group opened is closed, also after an error
	n.drv.ContextChanged()
	return errors.Join(errs...)
}

func (n *ncclComm) Close() error {
	var errs []error
	for _, c := range n.comms {
		errs = append(errs, n.lib.Destroy(c))
	}
	n.comms = nil
	n.drv.ContextChanged()
	return errors.Join(errs...)
}

// emuComm is a Comm over Emu devices: each group is copied at once (Emu runs
// work when it is queued), each buffer from and to its rank's device; the
// send reads on its rank's stream and the receive writes on its own, after
// the send's stream work (Emu's stream-order check).
type emuComm struct {
	emus    []*Emu
	streams []Stream
}

func openEmuComm(devs []Device, streams []Stream) (Comm, error) {
	c := &emuComm{}
	for r, d := range devs {
		b, ok := d.(emuBacked)
		if !ok {
			return nil, &NoCommError{fmt.Sprintf("rank %d's device is %s, rank 0's emulated", r, d.Name())}
		}
		if err := b.emu().on(streams[r]); err != nil || streams[r] == nil {
			return nil, fmt.Errorf("rank %d: %w", r, cmp.Or(err, errors.New("emu: no stream")))
		}
		c.emus = append(c.emus, b.emu())
	}
	c.streams = streams
	return c, nil
}

func (c *emuComm) Name() string { return "emulated send/recv (host memory copies)" }

func (c *emuComm) Exchange(xs []Xfer) error {
	if err := checkRanks(xs, len(c.emus)); err != nil {
		return err
	}
	for _, x := range xs {
		if x.Bytes == 0 {
			continue
		}
		src, err := c.emus[x.From].bytesAt(x.Src, x.Bytes)
		if err != nil {
			return fmt.Errorf("emu: rank %d's send: %w", x.From, err)
		}
		dst, err := c.emus[x.To].bytesAt(x.Dst, x.Bytes)
		if err != nil {
			return fmt.Errorf("emu: rank %d's receive: %w", x.To, err)
		}
		from, to := c.emus[x.From], c.emus[x.To]
		if err := from.queue("send", c.streams[x.From], from.rd(x.Src, x.Bytes)); err != nil {
			return err
		}
		orderAfter(c.streams[x.To], (*emuStream)(unsafe.Pointer(c.streams[x.From])).clock) // a receive completes after its send
		if err := to.queue("receive", c.streams[x.To], to.wr(x.Dst, x.Bytes)); err != nil {
			return err
		}
		copy(dst, src)
	}
	return nil
}

func (c *emuComm) Close() error { return nil }
