package comm

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/moebench/moebench/internal/cuda"
	"github.com/moebench/moebench/internal/hostsim"
	"github.com/moebench/moebench/kernels/device"
)

// fakeLib compiles the fake library NAME (internal/hostsim/fakes) into a library called
// file and points the environment variable env at it.
func fakeLib(t *testing.T, name, file, env string) {
	t.Helper()
	so, err := hostsim.BuildFake(name, t.TempDir(), file)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(env, so)
}

// fakeDriver opens the driver binding on internal/cuda's fake libcuda
// (device memory is host memory; it checks contexts, see fakecuda.c).
func fakeDriver(t *testing.T) *cuda.Driver {
	t.Helper()
	fakeLib(t, "fakecuda", "libcuda.so.1", "MOEBENCH_LIBCUDA")
	drv, err := cuda.OpenDriver()
	if err != nil {
		t.Fatal(err)
	}
	return drv
}

// TestCopyBatchRefusedFallsBack: on the fake driver (internal/hostsim's
// fakes: device memory is host memory), CopyBatch copies as one batch;
// once the driver refuses a batch as invalid, that batch and the later ones
// are copied one by one, and BatchMethod says why.
func TestCopyBatchRefusedFallsBack(t *testing.T) {
	drv := fakeDriver(t)
	ctx, err := drv.PrimaryContext(0)
	if err != nil {
		t.Fatal(err)
	}
	c := &device.CUDA{Drv: drv, Ctx: ctx}
	s, err := drv.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	src, dst := []uint16{1, 2, 3, 4, 5, 6, 7, 8}, make([]uint16, 8)
	ps, err := drv.Alloc(16)
	if err != nil {
		t.Fatal(err)
	}
	pd, err := drv.Alloc(16)
	if err != nil {
		t.Fatal(err)
	}
	swap := []device.CopyOp{{Dst: pd, Src: ps + 8, Bytes: 8}, {Dst: pd + 8, Src: ps, Bytes: 8}, {Dst: pd, Src: ps}} // the halves swapped
	// the third batch: the driver would take it, but a refusal is final
	for i, refuse := range []bool{false, true, false} {
		if refuse {
			t.Setenv("FAKECUDA_REFUSE_BATCH", "1")
		} else {
			os.Unsetenv("FAKECUDA_REFUSE_BATCH")
		}
		if err := c.Upload(ps, src, s); err != nil {
			t.Fatal(err)
		}
		if err := c.Fill16(pd, 0, 8, s); err != nil {
			t.Fatal(err)
		}
		if err := c.CopyBatch(swap, s); err != nil {
			t.Fatalf("refuse %v: %v", refuse, err)
		}
		if err := c.Download(dst, pd, s); err != nil {
			t.Fatal(err)
		}
		if want := slices.Concat(src[4:], src[:4]); !slices.Equal(dst, want) {
			t.Errorf("refuse %v: copied %v, want %v", refuse, dst, want)
		}
		if (c.BatchErr != nil) != (i > 0) { // refused once, it stays refused
			t.Errorf("batch %d: BatchErr %v", i, c.BatchErr)
		}
	}
	if c.BatchErr == nil || !strings.Contains(c.BatchMethod(), "refused the batch copy") || !strings.Contains(c.BatchMethod(), "CUDA_ERROR_INVALID_VALUE") {
		t.Errorf("after a refusal: BatchErr %v, method %q", c.BatchErr, c.BatchMethod())
	}
}

// TestTwoGPUsOnTheFakeDriver: two devices on one driver, used in turn from
// one goroutine, each make their own context current (the fake refuses a
// stream, event, allocation or copy used under another context's), copy
// between each other with peer copies and per-pair batches, and reach each
// other once peer access is enabled.
func TestTwoGPUsOnTheFakeDriver(t *testing.T) {
	drv := fakeDriver(t)
	var g [2]*device.CUDA
	for i := range g {
		ctx, err := drv.PrimaryContext(i)
		if err != nil {
			t.Fatal(err)
		}
		g[i] = &device.CUDA{Drv: drv, Ordinal: i, Ctx: ctx, Allocs: map[device.Addr]bool{}, Peers: map[int]bool{}}
	}
	ok := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	if g[0].Reaches(g[1]) || !g[0].Reaches(g[0]) {
		t.Error("before peer access: GPU 0 should reach itself only")
	}
	ok(device.EnablePeers(g[:]))
	ok(device.EnablePeers(g[:])) // enabled twice: the driver's "already enabled" is fine
	if !g[0].Reaches(g[1]) || !g[1].Reaches(g[0]) || g[0].Reaches(&device.Emu{}) {
		t.Error("after peer access: the GPUs should reach each other (and no Emu)")
	}
	// interleaved: a stream, an event pair and two buffers on each GPU
	var s [2]device.Stream
	var e [2][2]device.Event
	var a, b [2]device.Addr
	for i := range g {
		var err error
		s[i], err = g[i].NewStream()
		ok(err)
		for j := range e[i] {
			e[i][j], err = g[i].NewEvent()
			ok(err)
		}
		a[i], err = g[i].Alloc(16)
		ok(err)
		b[i], err = g[i].Alloc(16)
		ok(err)
	}
	src := [2][]uint16{{1, 2, 3, 4, 5, 6, 7, 8}, {11, 12, 13, 14, 15, 16, 17, 18}}
	for i := range g {
		ok(g[i].Record(e[i][0], s[i]))
		ok(g[i].Upload(a[i], src[i], s[i]))
		ok(g[i].Fill16(b[i], 0, 8, s[i]))
	}
	// GPU 1 pulls GPU 0's first half (a peer copy) once GPU 0's upload is
	// done, then a batch: GPU 0's second half and its own first half (two
	// pairs of GPUs)
	ok(g[0].Record(e[0][1], s[0]))
	ok(g[1].Wait(s[1], e[0][1]))
	ok(g[1].CopyPeer(device.CopyOp{Dst: b[1], Src: a[0], Bytes: 8, SrcDev: g[0]}, s[1]))
	ok(g[1].CopyBatch([]device.CopyOp{{Dst: b[1] + 8, Src: a[0] + 8, Bytes: 4, SrcDev: g[0]}, {Dst: b[1] + 12, Src: a[1], Bytes: 4}}, s[1]))
	// GPU 0 pushes GPU 1's last quarter into its own b from GPU 1's stream
	ok(g[1].CopyPeer(device.CopyOp{Dst: b[0], Src: a[1] + 12, Bytes: 4, DstDev: g[0]}, s[1]))
	if g[1].BatchErr != nil {
		t.Fatalf("batch across GPUs refused: %v", g[1].BatchErr)
	}
	got := make([]uint16, 8)
	ok(g[1].Download(got, b[1], s[1]))
	if want := []uint16{1, 2, 3, 4, 5, 6, 11, 12}; !slices.Equal(got, want) {
		t.Errorf("GPU 1 received %v, want %v", got, want)
	}
	ok(g[0].Download(got, b[0], s[0]))
	if want := []uint16{17, 18, 0, 0, 0, 0, 0, 0}; !slices.Equal(got, want) {
		t.Errorf("GPU 0 received %v, want %v", got, want)
	}
	for i := range g {
		ok(g[i].Record(e[i][1], s[i]))
		ok(g[i].SyncStream(s[i]))
		if _, err := g[i].Elapsed(e[i][0], e[i][1]); err != nil {
			t.Errorf("GPU %d: %v", i, err)
		}
	}
	if err := g[0].Record(e[1][1], s[0]); err == nil {
		t.Error("recording GPU 1's event on GPU 0's stream: the fake should refuse it")
	}
	for i := range g {
		ok(g[i].Close())
	}
}
