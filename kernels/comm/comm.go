package comm

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/kernels/device"
)

// Comm is a communicator over the ranks of a run, one rank per device: it
// moves data between ranks with grouped point-to-point transfers (NCCL on
// CUDA), each side on its rank's stream, each rank's side issued from its
// device's thread (Threads).
type Comm interface {
	// Name says what moves the data, with its version.
	Name() string
	// Exchange queues rank's side of one group of transfers on its
	// stream, from its device's thread: its sends and its receives. Every
	// rank calls it for the group (a collective: NCCL waits, and the fakes
	// time out, until every rank's side is queued); between two ranks, the
	// k-th send of one meets the k-th receive of the other from it, of the
	// same size. A rank may send to itself. Transfers of no bytes are
	// skipped (on both sides: their sizes agree); the rest of the stream's
	// work keeps its order around them.
	Exchange(rank int, sends, recvs []PeerTransfer) error
	Close() error
}

// PeerTransfer is one side of a transfer: Bytes of Buf (on the calling rank's
// device) to or from rank Peer.
type PeerTransfer struct {
	Peer  int
	Buf   device.Addr
	Bytes int64
}

// checkPeers: every transfer is with a rank of n, of no negative size.
func checkPeers(rank int, sends, recvs []PeerTransfer, n int) error {
	for i, xs := range [][]PeerTransfer{sends, recvs} {
		for _, x := range xs {
			if x.Peer < 0 || x.Peer >= n || x.Bytes < 0 || rank < 0 || rank >= n {
				return fmt.Errorf("rank %d of %d: a %s of %d bytes with rank %d", rank, n, [2]string{"send", "receive"}[i], x.Bytes, x.Peer)
			}
		}
	}
	return nil
}

// NoCommError says why a communicator cannot be had on these devices (an
// environment limitation: no library, ranks sharing a device).
type NoCommError struct{ Reason string }

func (e *NoCommError) Error() string { return e.Reason }

// OpenComm makes a communicator over devs, rank r on devs[r] with its work
// on streams[r], each rank joined from its device's thread of th: NCCL
// when every device is a GPU (ncclCommInitRank, one unique id), an
// emulated one over Emu devices (for tests). NCCL needs one GPU per rank.
func OpenComm(th *device.Threads, devs []device.Device, streams []device.Stream) (Comm, error) {
	return OpenWorldComm(th, devs, streams, ProcessRanks{})
}

// ProcessRanks places a process's devices among the ranks of a run that spans
// processes: they are ranks First… of Ranks, and ID gives every process
// the same NCCL unique id (made by newID on one of them: the
// rendezvous). The zero ProcessRanks is a run of one process.
type ProcessRanks struct {
	Ranks, First int
	ID           func(newID func() (cuda.UniqueID, error)) (cuda.UniqueID, error)
}

// OpenWorldComm is OpenComm over the devices of this process in a run
// that spans processes (w): its Exchange takes and names ranks by their
// place in the whole run. Only NCCL spans processes.
func OpenWorldComm(th *device.Threads, devs []device.Device, streams []device.Stream, w ProcessRanks) (Comm, error) {
	if len(devs) == 0 || len(devs) != len(streams) {
		return nil, fmt.Errorf("a communicator over %d devices with %d streams", len(devs), len(streams))
	}
	if w.Ranks == 0 {
		w = ProcessRanks{Ranks: len(devs)}
	}
	if w.First < 0 || w.First+len(devs) > w.Ranks {
		return nil, fmt.Errorf("a communicator's ranks %d… of %d over %d devices", w.First, w.Ranks, len(devs))
	}
	for a := range devs {
		for b := range a {
			if devs[a] == devs[b] {
				return nil, &NoCommError{fmt.Sprintf("ranks %d and %d share a device, and a communicator needs one device per rank (NCCL refuses a GPU twice)", w.First+b, w.First+a)}
			}
		}
	}
	rankOf, err := threadRanks(th, devs)
	if err != nil {
		return nil, err
	}
	if _, ok := devs[0].(device.EmuBacked); ok {
		if w.Ranks != len(devs) {
			return nil, &NoCommError{"an emulated communicator stays in one process"}
		}
		return openEmuComm(devs, streams)
	}
	for r, d := range devs {
		if _, ok := d.(*device.CUDA); !ok {
			return nil, &NoCommError{fmt.Sprintf("rank %d's device is %s: NCCL needs GPUs", w.First+r, d.Name())}
		}
	}
	lib, err := cuda.OpenNCCL()
	if err != nil {
		return nil, &NoCommError{err.Error()}
	}
	var id cuda.UniqueID
	if w.ID != nil {
		id, err = w.ID(lib.UniqueID)
	} else {
		id, err = lib.UniqueID()
	}
	if err != nil {
		return nil, err
	}
	n := &ncclComm{lib: lib, comms: make([]cuda.Comm, w.Ranks), streams: make([]device.Stream, w.Ranks), th: th, rankOf: rankOf}
	copy(n.streams[w.First:], streams)
	for i, r := range rankOf {
		if r >= 0 {
			rankOf[i] = w.First + r
		}
	}
	err = th.Each(func(dev int) error {
		r := rankOf[dev]
		if r < 0 {
			return nil
		}
		g := devs[r-w.First].(*device.CUDA)
		if err := g.MakeCurrent(); err != nil {
			return err
		}
		c, err := lib.InitRank(w.Ranks, id, r)
		g.Drv.ContextChanged()
		n.comms[r] = c
		return err
	})
	if err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

// threadRanks is the rank of each of th's threads (−1: a device with no
// rank); every rank's device must have a thread.
func threadRanks(th *device.Threads, devs []device.Device) ([]int, error) {
	if th == nil {
		return nil, fmt.Errorf("a communicator needs its devices' threads (device.Threads)")
	}
	rankOf := make([]int, len(th.Devices()))
	for i := range rankOf {
		rankOf[i] = -1
	}
	for r, d := range devs {
		i := th.Of(d)
		if i < 0 {
			return nil, fmt.Errorf("rank %d's device (%s) has no thread", r, d.Name())
		}
		rankOf[i] = r
	}
	return rankOf, nil
}

// ncclComm is a Comm over GPUs of one process: one NCCL communicator per
// GPU (ncclCommInitRank), each rank's side of a group in one
// ncclGroupStart/End on its thread.
type ncclComm struct {
	lib     *cuda.NCCL
	comms   []cuda.Comm
	streams []device.Stream
	th      *device.Threads
	rankOf  []int // each thread's rank
}

func (n *ncclComm) Name() string { return "NCCL " + n.lib.Version + " (grouped ncclSend/ncclRecv)" }

// NCCLComms is a Comm made of NCCL communicators, one per rank of this
// process: what a library built on NCCL (NCCL EP) creates its own state
// over.
type NCCLComms interface {
	// NCCLComm is rank's communicator (nil: a rank of another process).
	NCCLComm(rank int) cuda.Comm
}

func (n *ncclComm) NCCLComm(rank int) cuda.Comm {
	if rank < 0 || rank >= len(n.comms) {
		return nil
	}
	return n.comms[rank]
}

func (n *ncclComm) Exchange(rank int, sends, recvs []PeerTransfer) error {
	if err := checkPeers(rank, sends, recvs, len(n.comms)); err != nil {
		return err
	}
	if n.comms[rank] == nil {
		return fmt.Errorf("rank %d: not a rank of this process", rank)
	}
	if err := n.lib.GroupStart(); err != nil {
		return err
	}
	var first error
	c, s := n.comms[rank], n.streams[rank]
	for _, x := range sends {
		if x.Bytes > 0 && first == nil {
			first = n.lib.Send(x.Buf, x.Bytes, x.Peer, c, s)
		}
	}
	for _, x := range recvs {
		if x.Bytes > 0 && first == nil {
			first = n.lib.Recv(x.Buf, x.Bytes, x.Peer, c, s)
		}
	}
	err := n.lib.GroupEnd() // a group opened is closed, also after an error
	if first != nil {
		err = errors.Join(first, err)
	}
	if err != nil {
		return fmt.Errorf("rank %d: %w", rank, err)
	}
	return nil
}

// Close destroys each rank's communicator on its thread.
func (n *ncclComm) Close() error {
	err := n.th.Each(func(dev int) error {
		r := n.rankOf[dev]
		if r < 0 || n.comms[r] == nil {
			return nil
		}
		err := n.lib.Destroy(n.comms[r])
		n.comms[r] = nil
		return err
	})
	return err
}

// emuComm is a Comm over Emu devices, which run work when it is queued: a
// rank's sends are taken at its call (the bytes as they are then, the
// send's stream position for the order check); its receives wait for the
// matching sends of their peers' calls (at most collectiveWait: a peer
// that never calls is an error, where NCCL would hang), then copy and are
// ordered after the send's stream work.
type emuComm struct {
	emus    []*device.Emu
	streams []device.Stream
	mu      sync.Mutex
	cv      *sync.Cond
	box     map[[2]int][]emuMail // (from, to): sends not yet received, in order
}

type emuMail struct {
	data  []byte
	clock device.VectorClock
}

func openEmuComm(devs []device.Device, streams []device.Stream) (Comm, error) {
	c := &emuComm{box: map[[2]int][]emuMail{}}
	c.cv = sync.NewCond(&c.mu)
	for r, d := range devs {
		b, ok := d.(device.EmuBacked)
		if !ok {
			return nil, &NoCommError{fmt.Sprintf("rank %d's device is %s, rank 0's emulated", r, d.Name())}
		}
		if err := b.BackingEmu().TakeStream(streams[r]); err != nil || streams[r] == nil {
			return nil, fmt.Errorf("rank %d: %w", r, cmp.Or(err, errors.New("emu: no stream")))
		}
		c.emus = append(c.emus, b.BackingEmu())
	}
	c.streams = streams
	return c, nil
}

func (c *emuComm) Name() string { return "emulated send/recv (host memory copies)" }

func (c *emuComm) Exchange(rank int, sends, recvs []PeerTransfer) error {
	if err := checkPeers(rank, sends, recvs, len(c.emus)); err != nil {
		return err
	}
	e, s := c.emus[rank], c.streams[rank]
	for _, x := range sends {
		if x.Bytes == 0 {
			continue
		}
		src, err := e.BytesAt(x.Buf, x.Bytes)
		if err != nil {
			return fmt.Errorf("emu: rank %d's send to rank %d: %w", rank, x.Peer, err)
		}
		if err := e.Enqueue("send", s, e.ReadSpan(x.Buf, x.Bytes)); err != nil {
			return err
		}
		m := emuMail{data: slices.Clone(src), clock: device.StreamClock(s)}
		c.mu.Lock()
		k := [2]int{rank, x.Peer}
		c.box[k] = append(c.box[k], m)
		c.cv.Broadcast()
		c.mu.Unlock()
	}
	for _, x := range recvs {
		if x.Bytes == 0 {
			continue
		}
		dst, err := e.BytesAt(x.Buf, x.Bytes)
		if err != nil {
			return fmt.Errorf("emu: rank %d's receive from rank %d: %w", rank, x.Peer, err)
		}
		m, err := c.take([2]int{x.Peer, rank})
		if err != nil {
			return fmt.Errorf("emu: rank %d's receive of %d bytes from rank %d: %w", rank, x.Bytes, x.Peer, err)
		}
		if int64(len(m.data)) != x.Bytes {
			return fmt.Errorf("emu: rank %d's receive of %d bytes from rank %d met a send of %d", rank, x.Bytes, x.Peer, len(m.data))
		}
		device.OrderAfter(s, m.clock) // a receive completes after its send
		if err := e.Enqueue("receive", s, e.WriteSpan(x.Buf, x.Bytes)); err != nil {
			return err
		}
		copy(dst, m.data)
	}
	return nil
}

// take waits for the next send on pair k, at most collectiveWait.
func (c *emuComm) take(k [2]int) (emuMail, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	expired := false
	t := time.AfterFunc(device.CollectiveWait, func() {
		c.mu.Lock()
		expired = true
		c.cv.Broadcast()
		c.mu.Unlock()
	})
	defer t.Stop()
	for len(c.box[k]) == 0 && !expired {
		c.cv.Wait()
	}
	if len(c.box[k]) == 0 {
		return emuMail{}, fmt.Errorf("no matching send after %v (the peer never called Exchange: NCCL would hang)", device.CollectiveWait)
	}
	m := c.box[k][0]
	c.box[k] = c.box[k][1:]
	return m, nil
}

func (c *emuComm) Close() error { return nil }
