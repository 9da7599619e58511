package comm

import (
	"errors"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/internal/hostsim"
	"github.com/moebench/moebench/kernels/device"
)

// commCase is one run of comm_test: ranks placed on devices (rank r on
// devs[place[r]], a device's ranks contiguous), channels of items ints
// through rings of slots, a bug, each wait's timeout.
type commCase struct {
	place                  []int
	channels, slots, items int
	bug                    int32
	timeout                time.Duration
	hostWait               time.Duration // the host's wait for the counters (0: the timeout and a second)
}

// commResult is what a run gave: the launch's error (a residency refusal),
// the host's wait for the counters, the kernels' records, and each rank's
// received and expected ints.
type commResult struct {
	launch, host, kernel error
	got, want            [][]int32
}

// runCommTest sets comm_test up on devs, launches one part per device,
// waits for the counters as DeepEP's host does, and reads the outputs.
func runCommTest(t *testing.T, devs []device.Device, c commCase) commResult {
	t.Helper()
	ok := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	ranks := len(c.place)
	streams := make([]device.Stream, len(devs))
	for i, d := range devs {
		var err error
		streams[i], err = d.NewStream()
		ok(err)
	}
	rdev, rs := make([]device.Device, ranks), make([]device.Stream, ranks)
	for r, d := range c.place {
		rdev[r], rs[r] = devs[d], streams[d]
	}
	g := rand.New(rand.NewPCG(uint64(ranks), uint64(c.items)))
	n := c.channels * c.items
	var rings, src, dst, flags []device.Addr
	var res commResult
	alloc := func(r int, bytes int64) device.Addr {
		p, err := rdev[r].Alloc(bytes)
		ok(err)
		t.Cleanup(func() { rdev[r].Free(p) })
		return p
	}
	for r := range ranks {
		ring := alloc(r, int64(4*c.channels*(commTestRingHeader+c.slots)))
		ok(rdev[r].Fill16(ring, 0, int64(2*c.channels*(commTestRingHeader+c.slots)), rs[r]))
		in := make([]int32, n)
		for i := range in {
			in[i] = g.Int32()
		}
		res.want = append(res.want, in) // rank r's input, which rank r+1 receives
		s := alloc(r, int64(4*n))
		ok(rdev[r].Upload(s, in, rs[r]))
		d := alloc(r, int64(4*n))
		ok(rdev[r].Fill16(d, 0xffff, int64(2*n), rs[r]))
		f := alloc(r, int64(4*ranks))
		ok(rdev[r].Fill16(f, 0, int64(2*ranks), rs[r]))
		rings, src, dst, flags = append(rings, ring), append(src, s), append(dst, d), append(flags, f)
	}
	res.want = append(res.want[ranks-1:], res.want[:ranks-1]...)
	var tables [4][]device.Addr
	for i, bufs := range [][]device.Addr{rings, src, dst, flags} {
		tab, free, err := device.PeerTables(rdev, bufs, rs)
		ok(err)
		t.Cleanup(func() { free() })
		tables[i] = tab
	}
	sig, err := NewSignals(rdev, rs, ranks*c.channels)
	ok(err)
	sig.Names = CommTestNames
	for _, s := range streams { // buffers ready before any part starts
		ok(rdevOf(devs, streams, s).SyncStream(s))
	}
	used := slices.Compact(slices.Clone(c.place))
	col := device.NewCollective(CommTestProgram(c.channels, c.slots), len(used))
	for first := 0; first < ranks; {
		d := c.place[first]
		count := 0
		for first+count < ranks && c.place[first+count] == d {
			count++
		}
		err := devs[d].LaunchResident(col, 2*c.channels*count, streams[d], sig.Comm(devs[d], c.timeout), int32(first), int32(ranks),
			int32(c.items), c.bug, int32(1), tables[0][first], tables[1][first], tables[2][first], tables[3][first])
		if err != nil {
			res.launch = err
			return res
		}
		first += count
	}
	hostWait := c.timeout + time.Second
	if c.hostWait > 0 {
		hostWait = c.hostWait
	}
	for i := range ranks * c.channels {
		if _, err := sig.WaitCounter(i, "items received", func(v int32) bool { return int(v) == c.items }, hostWait); err != nil {
			res.host = err
			break
		}
	}
	for i, s := range streams {
		ok(devs[i].SyncStream(s))
	}
	res.kernel = sig.Err()
	for r := range ranks {
		got := make([]int32, n)
		ok(rdev[r].Download(got, dst[r], rs[r]))
		res.got = append(res.got, got)
	}
	ok(sig.Free())
	return res
}

// rdevOf is the device of stream s (streams[i] is devs[i]'s).
func rdevOf(devs []device.Device, streams []device.Stream, s device.Stream) device.Device {
	return devs[slices.Index(streams, s)]
}

// checkCommTest runs comm_test's cases on devs (two devices): working
// protocols deliver every item, broken ones end by the kernels' timeouts
// with the rank, phase and wait named, too many blocks are refused.
func checkCommTest(t *testing.T, devs []device.Device) {
	fits := func(t *testing.T, c commCase) {
		if slices.Max(c.place) >= len(devs) {
			t.Skipf("needs %d devices", slices.Max(c.place)+1)
		}
	}
	good := func(t *testing.T, c commCase) {
		fits(t, c)
		var r commResult
		hostsim.Within(t, 30*time.Second, func() { r = runCommTest(t, devs, c) })
		if r.launch != nil || r.host != nil || r.kernel != nil {
			t.Fatalf("launch %v; host %v; kernels %v", r.launch, r.host, r.kernel)
		}
		for rank := range r.got {
			if !slices.Equal(r.got[rank], r.want[rank]) {
				t.Fatalf("rank %d received %v…, want %v…", rank, r.got[rank][:4], r.want[rank][:4])
			}
		}
	}
	// items above the ring's slots: the senders wait for room
	t.Run("two-ranks-two-devices", func(t *testing.T) {
		good(t, commCase{place: []int{0, 1}, channels: 2, slots: 32, items: 300, timeout: 5 * time.Second})
	})
	t.Run("two-ranks-one-device", func(t *testing.T) {
		good(t, commCase{place: []int{0, 0}, channels: 2, slots: 32, items: 200, timeout: 5 * time.Second})
	})
	t.Run("four-ranks-two-devices", func(t *testing.T) {
		good(t, commCase{place: []int{0, 0, 1, 1}, channels: 2, slots: 32, items: 100, timeout: 5 * time.Second})
	})
	// hostSees: the host's wait for the counters ends with the kernels' error
	broken := func(t *testing.T, c commCase, hostSees bool, want ...string) {
		fits(t, c)
		var r commResult
		start := time.Now()
		hostsim.Within(t, 30*time.Second, func() { r = runCommTest(t, devs, c) })
		var ce, he *CommError
		if r.launch != nil || !errors.As(r.kernel, &ce) || hostSees != errors.As(r.host, &he) {
			t.Fatalf("launch %v; host %v; kernels %v: want the kernels' timeout (the host's wait ending with it: %v)", r.launch, r.host, r.kernel, hostSees)
		}
		if !ce.Records[0].TimedOut || ce.Records[0].Waited < c.timeout {
			t.Errorf("first record %+v: want a wait that timed out after %v", ce.Records[0], c.timeout)
		}
		for _, w := range want {
			if !strings.Contains(r.kernel.Error(), w) {
				t.Errorf("%v: want %q in it", r.kernel, w)
			}
		}
		t.Logf("%v (%.2f s)", r.kernel, time.Since(start).Seconds())
	}
	t.Run("missing-tail", func(t *testing.T) {
		broken(t, commCase{place: []int{0, 1}, channels: 2, slots: 32, items: 12, bug: CommTestNoTail, timeout: 200 * time.Millisecond}, true,
			"timed out in phase recv at wait tail", "read 0, waiting for 1")
	})
	t.Run("barrier-not-reached", func(t *testing.T) {
		broken(t, commCase{place: []int{0, 1}, channels: 2, slots: 32, items: 12, bug: CommTestNoBarrier, timeout: 200 * time.Millisecond}, false,
			"rank 0 timed out in phase barrier at wait flag of rank 1", "read 0, waiting for 1")
	})
	// the host gives up first: its abort reaches every waiting kernel,
	// which records that it gave up (not a timeout of its own) long before
	// its own timeout (the abort word is read every 4096 loads of a wait)
	t.Run("host-abort", func(t *testing.T) {
		c := commCase{place: []int{0, 1}, channels: 2, slots: 32, items: 12, bug: CommTestNoTail, timeout: 20 * time.Second, hostWait: 100 * time.Millisecond}
		fits(t, c)
		var r commResult
		start := time.Now()
		hostsim.Within(t, 30*time.Second, func() { r = runCommTest(t, devs, c) })
		var he *HostWaitError
		var ce *CommError
		if r.launch != nil || !errors.As(r.host, &he) || !errors.As(r.kernel, &ce) {
			t.Fatalf("launch %v; host %v; kernels %v: want the host's timeout, then the kernels' records", r.launch, r.host, r.kernel)
		}
		for _, rec := range ce.Records {
			if rec.TimedOut || rec.Check {
				t.Errorf("record %+v: want a rank that gave up after the host", rec)
			}
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("the kernels ended after %v: the host's abort did not reach them before their own %v timeout", took, c.timeout)
		}
		t.Logf("%v (%.2f s)", r.kernel, time.Since(start).Seconds())
	})
	t.Run("too-many-blocks", func(t *testing.T) {
		// one rank more than the device holds (4 blocks each)
		ranks := resident(t, devs[0], CommTestProgram(2, 32))/4 + 1
		var r commResult
		hostsim.Within(t, 30*time.Second, func() {
			r = runCommTest(t, devs, commCase{place: make([]int, ranks), channels: 2, slots: 32, items: 10, timeout: time.Second})
		})
		var re *device.ResidencyError
		if !errors.As(r.launch, &re) || re.Grid != 4*ranks {
			t.Fatalf("launch: %v, want a residency error for %d blocks", r.launch, 4*ranks)
		}
		t.Log(r.launch)
	})
	t.Run("two-parts-on-one-device", func(t *testing.T) {
		col := device.NewCollective(CommTestProgram(2, 32), 2)
		s1, _ := devs[0].NewStream()
		s2, _ := devs[0].NewStream()
		sig, err := NewSignals([]device.Device{devs[0], devs[0]}, []device.Stream{s1, s2}, 2)
		if err != nil {
			t.Fatal(err)
		}
		nulls, err := devs[0].Alloc(16) // tables of null pointers, never followed
		if err != nil {
			t.Fatal(err)
		}
		if err := devs[0].Fill16(nulls, 0, 8, s1); err != nil {
			t.Fatal(err)
		}
		// no items, and rank 1 of 2 skips the barrier (bug 2): the kernel
		// only writes its counter
		args := []any{sig.Comm(devs[0], time.Second), int32(1), int32(2), int32(0), int32(CommTestNoBarrier), int32(1), nulls, nulls, nulls, nulls}
		if err := devs[0].LaunchResident(col, 2, s1, args...); err == nil {
			err = devs[0].LaunchResident(col, 1, s2, args...)
			if err == nil || !strings.Contains(err.Error(), "second launch on one device") {
				t.Errorf("a second part on one device: %v", err)
			}
		}
	})
}

// TestCommTestOnHostSim: comm_test's CUDA C on the host simulation over the
// fake driver's two GPUs, each block of each launch on its own thread.
func TestCommTestOnHostSim(t *testing.T) {
	t.Setenv("FAKECUDA_SMS", "8") // a block holds an SM: two ranks' 2 channels × 2 blocks on one GPU
	useHostSim(t)
	gs, err := device.OpenGPUs(2, 2, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(gs)
	checkCommTest(t, []device.Device{gs[0], gs[1]})
	// the fake driver itself refuses the oversized cooperative launch, and
	// reports the occupancy it refuses by
	g := gs[0]
	p := CommTestProgram(2, 32)
	f, err := g.Program(p)
	if err != nil {
		t.Fatal(err)
	}
	per, err := g.Drv.Occupancy(f, CommTestBlock, 0)
	if regs, _ := g.Drv.FuncAttribute(f, cuda.FuncAttrNumRegs); err != nil || per != 2 || regs != 255 {
		t.Fatalf("occupancy %d, %d registers, %v: want 2 blocks per SM (255 registers × 128 threads)", per, regs, err)
	}
	s, _ := g.NewStream()
	sig, err := NewSignals([]device.Device{g, g}, []device.Stream{s, s}, 2)
	if err != nil {
		t.Fatal(err)
	}
	nulls, err := g.Alloc(16)
	if err == nil {
		err = g.Fill16(nulls, 0, 8, s)
	}
	if err != nil {
		t.Fatal(err)
	}
	// arguments of a kernel that does nothing (see two-parts-on-one-device)
	err = g.Drv.LaunchCooperative(f, [3]uint32{uint32(per*g.SMs + 1), 1, 1}, [3]uint32{CommTestBlock, 1, 1}, 0, s,
		sig.Comm(g, time.Second), int32(1), int32(2), int32(0), int32(CommTestNoBarrier), int32(1), nulls, nulls, nulls, nulls)
	var ce *cuda.Error
	if !errors.As(err, &ce) || ce.Code != cuda.ErrCooperativeTooLarge {
		t.Errorf("cooperative launch of %d blocks: %v, want CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE", per*g.SMs+1, err)
	}
}

// resident is how many blocks of p dev holds at once.
func resident(t *testing.T, dev device.Device, p *device.Program) int {
	g, ok := dev.(*device.CUDA)
	if !ok {
		t.Fatalf("comm_test runs on the cuda device only, not on %T", dev)
	}
	per, err := g.Residency(p)
	if err != nil {
		t.Fatal(err)
	}
	return per * g.SMs
}

// TestGPUCommTest: comm_test on the GPUs (cases of two devices need two).
func TestGPUCommTest(t *testing.T) {
	gs, err := device.OpenGPUs(0, 2, t.TempDir())
	if err != nil {
		if os.Getenv("MOEBENCH_REQUIRE_GPU") == "1" {
			t.Fatalf("GPU required: %v", err)
		}
		t.Skipf("no GPU: %v", err)
	}
	defer closeAll(gs)
	devs := make([]device.Device, len(gs))
	for i, g := range gs {
		devs[i] = g
	}
	checkCommTest(t, devs)
}

func closeAll(gs []*device.CUDA) {
	for _, g := range gs {
		g.Close()
	}
}

// TestHostWaitTimesOut: the host's wait for a counter no kernel writes
// ends after its timeout, names the counter, and aborts the kernels.
func TestHostWaitTimesOut(t *testing.T) {
	e := &device.Emu{}
	st, err := e.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	sig, err := NewSignals([]device.Device{e, e}, []device.Stream{st, st}, 3)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = sig.WaitCounter(2, "received tokens", func(v int32) bool { return v > 0 }, 50*time.Millisecond)
	var he *HostWaitError
	if !errors.As(err, &he) || he.Counter != 2 || time.Since(start) < 50*time.Millisecond || !strings.Contains(err.Error(), "received tokens") {
		t.Fatalf("%v after %v", err, time.Since(start))
	}
	if *sig.mem.Int32At(0) != 1 {
		t.Error("the host's timeout did not abort the kernels")
	}
}

// TestHostWaitSpinsOnlyOnGPU: WaitCounter spins (yields between polls)
// for its first pollSpin only on a GPU; on a simulated one (Emu, the host
// simulation's fake driver) it sleeps from the start, leaving the CPU to
// the simulated kernels. Seen failing with the spin on every device.
func TestHostWaitSpinsOnlyOnGPU(t *testing.T) {
	e := &device.Emu{}
	st, err := e.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	g := hostSimCUDA(t)
	gs, err := g.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		dev  device.Device
		st   device.Stream
	}{{"emu", e, st}, {"hostsim", g, gs}} {
		if device.Hardware(c.dev) {
			t.Errorf("%s: device.Hardware says it is a GPU", c.name)
		}
		sig, err := NewSignals([]device.Device{c.dev}, []device.Stream{c.st}, 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.dev.SyncStream(c.st); err != nil {
			t.Fatal(err)
		}
		// a wait of 3 pollSpins that ends unmet: it would spin through the first
		if _, err := sig.WaitCounter(0, "nothing", func(v int32) bool { return v > 0 }, 3*pollSpin); err == nil {
			t.Fatalf("%s: the wait for a counter never written ended without an error", c.name)
		}
		if n := sig.spins.Load(); n != 0 {
			t.Errorf("%s: the host's wait spun %d times on a simulated device", c.name, n)
		}
		// as on a GPU: it spins first
		if err := sig.Reset([]device.Stream{c.st}); err != nil {
			t.Fatal(err)
		}
		if err := c.dev.SyncStream(c.st); err != nil {
			t.Fatal(err)
		}
		sig.spin = true
		if _, err := sig.WaitCounter(0, "nothing", func(v int32) bool { return v > 0 }, 3*pollSpin); err == nil {
			t.Fatalf("%s: the wait for a counter never written ended without an error", c.name)
		}
		if n := sig.spins.Load(); n == 0 {
			t.Errorf("%s: with spin set (a GPU) the host's wait did not spin", c.name)
		}
		if err := sig.Free(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSignalsAbortWithNoRecord: an abort word set with no record is an
// error after the kernels (Err), and none while they may still be writing
// the record (Recorded); new signals have neither, and their claim words
// are zero whatever the memory held.
func TestSignalsAbortWithNoRecord(t *testing.T) {
	e := &device.Emu{}
	st, err := e.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	sig, err := NewSignals([]device.Device{e, e}, []device.Stream{st, st}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.SyncStream(st); err != nil {
		t.Fatal(err)
	}
	claims := make([]int32, 2)
	if err := e.Download(claims, sig.claims[e], st); err != nil || claims[0] != 0 || claims[1] != 0 {
		t.Fatalf("claim words %v (%v): want zero", claims, err)
	}
	if sig.Err() != nil || sig.Recorded() != nil {
		t.Fatalf("new signals: %v, %v", sig.Err(), sig.Recorded())
	}
	sig.Abort()
	if err := sig.Err(); !errors.Is(err, ErrAbortedNoRecord) {
		t.Errorf("Err after an abort with no record: %v", err)
	}
	if err := sig.Recorded(); err != nil {
		t.Errorf("Recorded after an abort with no record: %v", err)
	}
}
