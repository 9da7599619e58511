package cuda

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moebench/moebench/internal/hostsim"
)

// epRig is NCCL EP on the fakes: two ranks, one per fake GPU, each with a
// communicator, a stream and buffers of a tiny layer (4 tokens of hidden
// 16, top-2 of 8 experts).
type epRig struct {
	d    *Driver
	e    *NCCLEP
	comm [2]Comm
	s    [2]Stream
	buf  [2]struct{ idx, x, w, out, outW, counts DevicePtr }
}

const epTokens, epHidden, epTopK, epExperts = 4, 16, 2, 8

func newEPRig(t *testing.T) *epRig {
	t.Helper()
	r := &epRig{d: fakeDriver(t)}
	buildFake(t, "fakenccl", "MOEBENCH_NCCL")
	buildFake(t, "fakencclep", NCCLEPEnv)
	t.Setenv("NCCL_EP_TIMEOUT_MS", "300")
	var err error
	if r.e, err = OpenNCCLEP(); err != nil {
		t.Fatal(err)
	}
	if r.e.Version != "0.1.0" || r.e.NCCL.Version != "2.21.5" {
		t.Errorf("versions %q over NCCL %q", r.e.Version, r.e.NCCL.Version)
	}
	id, err := r.e.NCCL.UniqueID()
	if err != nil {
		t.Fatal(err)
	}
	for g, err := range onGPUs(r.d, func(g int) error {
		var err error
		if r.comm[g], err = r.e.NCCL.InitRank(2, id, g); err != nil {
			return err
		}
		if r.s[g], err = r.d.NewStream(0); err != nil {
			return err
		}
		b := &r.buf[g]
		for _, p := range []struct {
			p     *DevicePtr
			bytes int
		}{{&b.idx, 4 * epTokens * epTopK}, {&b.x, 2 * epTokens * epHidden}, {&b.w, 4 * epTokens * epTopK},
			{&b.out, 2 * 2 * epTokens * epTopK * epHidden}, {&b.outW, 4 * 2 * epTokens * epTopK}, {&b.counts, 4 * epExperts}} {
			if *p.p, err = r.d.Alloc(int64(p.bytes)); err != nil {
				return err
			}
		}
		return CopyToDevice(r.d, b.idx, []int32{0, 1, 2, 3, 4, 5, 6, 7}, r.s[g])
	}) {
		if err != nil {
			t.Fatalf("rank %d: %v", g, err)
		}
	}
	return r
}

func (r *epRig) config(maxRecv int) EPGroupConfig {
	return EPGroupConfig{Algorithm: EPHighThroughput, Experts: epExperts, MaxTokens: epTokens, MaxRecv: maxRecv, TokenBytes: 2 * epHidden, Timeout: time.Second}
}

// ranks runs f(rank) on both ranks' threads (GPU g's context current).
func (r *epRig) ranks(f func(g int) error) [2]error { return onGPUs(r.d, f) }

// TestNCCLEPCollectiveRule: the collective rule of NCCL EP's contract, on
// the fake: a rank that does not create its group leaves the other's
// creation to fail after the timeout (the real library hangs); a rank that
// does not dispatch leaves the other's dispatch to fail its GPU (the real
// one traps); an eager dispatch (max_recv_tokens_per_rank 0) blocks its
// thread until every rank has dispatched, which is why each rank has its
// own thread.
func TestNCCLEPCollectiveRule(t *testing.T) {
	r := newEPRig(t)
	errs := r.ranks(func(g int) error {
		if g == 1 {
			return nil // rank 1 never creates its group
		}
		_, err := r.e.CreateGroup(r.comm[g], r.config(2*epTokens*epTopK))
		return err
	})
	var ne *NCCLError
	if !errors.As(errs[0], &ne) || ne.Call != "ncclEpCreateGroup" || ne.Name != "ncclInternalError" {
		t.Errorf("a group created by one rank of two: %v", errs[0])
	}

	for _, eager := range []bool{false, true} {
		r := newEPRig(t)
		maxRecv := 2 * epTokens * epTopK
		if eager {
			maxRecv = 0
		}
		blocked := [2]time.Duration{}
		errs := r.ranks(func(g int) error {
			grp, err := r.e.CreateGroup(r.comm[g], r.config(maxRecv))
			if err != nil {
				return err
			}
			h, err := r.e.InitHandle(grp, epTopK)
			if err != nil {
				return err
			}
			b := r.buf[g]
			tok, w := EPTensor{b.x, NCCLBfloat16, []int{epTokens, epHidden}}, EPTensor{b.w, NCCLFloat32, []int{epTokens, epTopK}}
			out, outW := EPTensor{b.out, NCCLBfloat16, []int{maxRecvOr(maxRecv), epHidden}}, EPTensor{b.outW, NCCLFloat32, []int{maxRecvOr(maxRecv)}}
			if err := r.e.Dispatch(h, tok, w, out, outW, EPTensor{}, r.s[g]); err == nil || !strings.Contains(err.Error(), "ncclEpDispatch: ncclInvalidUsage") {
				return fmt.Errorf("a dispatch before the handle's update: %v", err)
			}
			counts := EPTensor{b.counts, NCCLInt32, []int{epExperts / 2}}
			total := EPTensor{b.counts + DevicePtr(4*epExperts/2), NCCLInt32, []int{1}}
			if err := r.e.UpdateHandle(h, EPTensor{b.idx, NCCLInt32, []int{epTokens, epTopK}}, counts, total, r.s[g]); err != nil {
				return err
			}
			if g == 1 {
				return r.d.SyncStream(r.s[g]) // rank 1 does not dispatch
			}
			t0 := time.Now()
			err = r.e.Dispatch(h, tok, w, out, outW, EPTensor{}, r.s[g])
			blocked[g] = time.Since(t0)
			if eager {
				return err
			}
			if err != nil {
				return err
			}
			if err := r.d.SyncStream(r.s[g]); err == nil || !strings.Contains(err.Error(), "CUDA_ERROR_LAUNCH_FAILED") {
				return fmt.Errorf("a dispatch rank 1 skipped, on rank 0's stream: %v", err)
			}
			if err := r.e.DestroyHandle(h); err != nil {
				return err
			}
			if err := r.e.Dispatch(h, tok, w, out, outW, EPTensor{}, r.s[g]); err == nil || !strings.Contains(err.Error(), "ncclInvalidUsage") {
				return fmt.Errorf("a dispatch on a destroyed handle: %v", err)
			}
			if err := r.e.DestroyGroup(grp); err != nil {
				return err
			}
			if err := r.e.DestroyGroup(grp); err == nil {
				return fmt.Errorf("a group destroyed twice: accepted")
			}
			return nil
		})
		if eager {
			if err := errs[0]; err == nil || !strings.Contains(err.Error(), "ncclEpDispatch: ncclInternalError") || blocked[0] < 300*time.Millisecond {
				t.Errorf("an eager dispatch rank 1 skipped: %v after %v (want the read-back's failure after the 300 ms timeout)", err, blocked[0])
			}
			continue
		}
		for g, err := range errs {
			if err != nil {
				t.Errorf("rank %d: %v", g, err)
			}
		}
		if blocked[0] > 200*time.Millisecond {
			t.Errorf("a dispatch with a fixed budget blocked its thread %v: it queues and returns", blocked[0])
		}
	}
}

// TestNCCLEPAcrossProcesses: the fake's path for a communicator that
// spans processes (FAKENCCL_NET: each rank as if in a process of its own,
// every byte through the fake NCCL's loopback send/recv) keeps the
// collective rule: the collective-rule test passes on it; a rank that does
// not create its group, or does not dispatch, is named by the other after
// the group's timeout (the transport's own wait is 120 s); a rank that
// calls another collective is named with both calls; and an update and a
// dispatch that every rank calls succeed, each rank's received rows
// counted from both ranks' routing.
func TestNCCLEPAcrossProcesses(t *testing.T) {
	t.Setenv("FAKENCCL_NET", "1")
	t.Setenv("FAKENCCL_TIMEOUT_S", "120")
	t.Run("collective-rule", func(t *testing.T) {
		hostsim.SkipIfShort(t, "TestNCCLEPCollectiveRule in one process")
		TestNCCLEPCollectiveRule(t)
	})
	for _, c := range []struct {
		name string
		skip func(g int, call string) bool // rank g does not make call
		want string
	}{
		{"no-group", func(g int, call string) bool { return g == 1 && call == "create" },
			"rank 0: timeout in ncclEpCreateGroup after 300 ms: nothing from rank 1, which did not take part"},
		{"no-dispatch", func(g int, call string) bool { return g == 1 && call == "dispatch" },
			"rank 0: timeout in ncclEpDispatch after 300 ms: nothing from rank 1, which did not take part"},
		{"another-call", func(g int, call string) bool { return g == 1 && call == "dispatch-as-combine" },
			"rank 1 called ncclEpCombine (its collective call 3 of the group) while rank 0 called ncclEpDispatch (call 3)"},
		{"all-call", func(int, string) bool { return false }, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "no-group" || c.name == "no-dispatch" {
				hostsim.SkipIfShort(t, "TestNCCLEPCollectiveRule's in one process, and another-call")
			}
			r := newEPRig(t)
			var errs [2]error
			took := time.Now()
			stderr := captureStderr(t, func() {
				errs = r.ranks(func(g int) error {
					if c.skip(g, "create") {
						return nil
					}
					grp, err := r.e.CreateGroup(r.comm[g], r.config(2*epTokens*epTopK))
					if err != nil {
						return err
					}
					h, err := r.e.InitHandle(grp, epTopK)
					if err != nil {
						return err
					}
					b, rows := r.buf[g], 2*epTokens*epTopK
					counts := EPTensor{b.counts, NCCLInt32, []int{epExperts / 2}}
					total := EPTensor{b.counts + DevicePtr(4*epExperts/2), NCCLInt32, []int{1}}
					if err := r.e.UpdateHandle(h, EPTensor{b.idx, NCCLInt32, []int{epTokens, epTopK}}, counts, total, r.s[g]); err != nil {
						return err
					}
					tok, w := EPTensor{b.x, NCCLBfloat16, []int{epTokens, epHidden}}, EPTensor{b.w, NCCLFloat32, []int{epTokens, epTopK}}
					out, outW := EPTensor{b.out, NCCLBfloat16, []int{rows, epHidden}}, EPTensor{b.outW, NCCLFloat32, []int{rows}}
					switch {
					case c.skip(g, "dispatch"):
					case c.skip(g, "dispatch-as-combine"):
						err = r.e.Combine(h, out, tok, EPTensor{}, r.s[g])
					default:
						err = r.e.Dispatch(h, tok, w, out, outW, EPTensor{}, r.s[g])
					}
					if err != nil || c.want != "" {
						return errors.Join(err, r.d.SyncStream(r.s[g]))
					}
					// both ranks route token t to experts 2t and 2t+1, of rank
					// t/2: each rank counts two rows per local expert, eight in
					// all, half of them the other process's
					got := make([]int32, epExperts/2+1)
					if err := CopyFromDevice(r.d, got, b.counts, r.s[g]); err != nil {
						return err
					}
					if fmt.Sprint(got) != "[2 2 2 2 8]" {
						return fmt.Errorf("received counts %v, want [2 2 2 2 8]", got)
					}
					return nil
				})
			})
			if c.want == "" {
				for g, err := range errs {
					if err != nil {
						t.Errorf("rank %d: %v\n%s", g, err, stderr)
					}
				}
				return
			}
			if errs[0] == nil || !strings.Contains(stderr, c.want) || time.Since(took) > 30*time.Second {
				t.Errorf("after %v: rank 0: %v; stderr:\n%s", time.Since(took), errs[0], stderr)
			}
			t.Logf("rank 0: %v (%v)", errs[0], time.Since(took).Round(time.Millisecond))
		})
	}
}

// TestNCCLEPGroupAlike: ranks that configure a group differently (here
// max_dispatch_tokens_per_rank, which nccl_ep.h says must be the same on
// every rank) are refused with ncclInvalidUsage on every rank — in one
// process and across processes (FAKENCCL_NET).
func TestNCCLEPGroupAlike(t *testing.T) {
	eachNet(t, func(t *testing.T, net string) {
		r := newEPRig(t)
		errs := r.ranks(func(g int) error {
			c := r.config(2 * epTokens * epTopK)
			c.MaxTokens += g
			_, err := r.e.CreateGroup(r.comm[g], c)
			return err
		})
		for g, err := range errs {
			var ne *NCCLError
			if !errors.As(err, &ne) || ne.Call != "ncclEpCreateGroup" || ne.Name != "ncclInvalidUsage" {
				t.Errorf("net %q: rank %d: %v", net, g, err)
			}
		}
	})
}

// TestNCCLEPCommOutlivesGroup: the NCCL communicator a group was created
// over must outlive the group and its handles (the library works, and
// releases its windows, through it): a handle or group destroyed after it
// is ncclInvalidUsage, in one process and across processes.
func TestNCCLEPCommOutlivesGroup(t *testing.T) {
	eachNet(t, func(t *testing.T, net string) {
		r := newEPRig(t)
		errs := r.ranks(func(g int) error {
			grp, err := r.e.CreateGroup(r.comm[g], r.config(2*epTokens*epTopK))
			if err != nil {
				return err
			}
			h, err := r.e.InitHandle(grp, epTopK)
			if err != nil {
				return err
			}
			if err := r.e.NCCL.Destroy(r.comm[g]); err != nil {
				return err
			}
			return errors.Join(r.e.DestroyHandle(h), r.e.DestroyGroup(grp))
		})
		for g, err := range errs {
			if err == nil || !strings.Contains(err.Error(), "ncclEpHandleDestroy: ncclInvalidUsage") || !strings.Contains(err.Error(), "ncclEpGroupDestroy: ncclInvalidUsage") {
				t.Errorf("net %q: rank %d: %v", net, g, err)
			}
		}
	})
}

// eachNet runs fn as two subtests: the ranks in one process, and across
// processes (FAKENCCL_NET=1, net "1"; skipped under -short, where the one
// process and TestNCCLEPAcrossProcesses/all-call cover the rule).
func eachNet(t *testing.T, fn func(t *testing.T, net string)) {
	for _, net := range []string{"", "1"} {
		t.Run(map[string]string{"": "one-process", "1": "across-processes"}[net], func(t *testing.T) {
			if net != "" {
				hostsim.SkipIfShort(t, "one-process, and TestNCCLEPAcrossProcesses/all-call")
			}
			t.Setenv("FAKENCCL_NET", net)
			fn(t, net)
		})
	}
}

// captureStderr runs f with file descriptor 2 (the C libraries' stderr)
// sent to a file, and returns what was written.
func captureStderr(t *testing.T, f func()) string {
	t.Helper()
	tmp, err := os.CreateTemp(t.TempDir(), "stderr")
	if err != nil {
		t.Fatal(err)
	}
	defer tmp.Close()
	saved, err := syscall.Dup(2)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Dup3(int(tmp.Fd()), 2, 0); err != nil {
		t.Fatal(err)
	}
	func() {
		defer syscall.Dup3(saved, 2, 0)
		f()
	}()
	syscall.Close(saved)
	b, _ := os.ReadFile(tmp.Name())
	return string(b)
}

func maxRecvOr(n int) int {
	if n == 0 {
		return 2 * epTokens * epTopK
	}
	return n
}

// TestNCCLEPDoctor: doctor's NCCL EP row gives the library's file and
// release, what it sends of the API (V1 structs), NCCL's version, and
// whether the run-time needs are met — or each one that is not, or why
// the library is not there (with how to install it).
func TestNCCLEPDoctor(t *testing.T) {
	buildFake(t, "fakenccl", "MOEBENCH_NCCL")
	buildFake(t, "fakencclep", NCCLEPEnv)
	hostsim.FakeNCCLEPRuntime(t)
	t.Setenv("FAKENCCL_VERSION", "23007")
	c := probeNCCLEP()
	if !c.Found || c.Version != "0.1.0" || c.Path != os.Getenv(NCCLEPEnv) {
		t.Fatalf("%+v", c)
	}
	for _, w := range []string{"hybridep --impl library (its high-throughput mode)", "deepep-ll --impl library (its low-latency mode)",
		"release 0.1.0 (ncclEpGetVersion", "frozen V1 sizes", "over NCCL 2.30.7", "NCCL's Device API and its run-time compile's needs found (nvcc "} {
		if !strings.Contains(c.Detail, w) {
			t.Errorf("detail %q: want %q in it", c.Detail, w)
		}
	}
	t.Setenv("FAKENCCL_VERSION", "22803")
	t.Setenv("NCCL_EP_JIT_NVCC", "/nonexistent/nvcc")
	if c := probeNCCLEP(); !c.Found || !strings.Contains(c.Detail, "missing: NCCL 2.28.3 has no Device API") || !strings.Contains(c.Detail, "; nvcc (/nonexistent/nvcc") {
		t.Errorf("without the Device API and nvcc: %+v", c)
	}
	t.Setenv("FAKENCCL_VERSION", "23007")
	t.Setenv("NCCL_EP_JIT_NVCC", "")
	dir := t.TempDir() // an NCCL of a version with the Device API, built without it
	if _, err := hostsim.BuildFake("fakenccl", dir, "libnccl.so.2"); err != nil {
		t.Fatal(err)
	}
	noDev := filepath.Join(dir, "libnccl-nodev.so.2")
	if out, err := exec.Command("cc", "-DFAKENCCL_NO_DEVICE_API", "-O2", "-shared", "-fPIC", "-pthread", "-o", noDev, filepath.Join(dir, "fakenccl.c")).CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	withDev := os.Getenv("MOEBENCH_NCCL")
	t.Setenv("MOEBENCH_NCCL", noDev)
	if c := probeNCCLEP(); !strings.HasSuffix(c.Detail, "missing: NCCL 2.30.7 lacks ncclDevCommCreate of the Device API NCCL EP needs") {
		t.Errorf("an NCCL without the Device API's entry points: %+v", c)
	}
	t.Setenv("MOEBENCH_NCCL", withDev)
	t.Setenv(NCCLEPEnv, withDev) // a library without NCCL EP's entry points
	if c := probeNCCLEP(); c.Found || !strings.Contains(c.Detail, "not the API moebench speaks") || !strings.Contains(c.Detail, "install: pip install nccl-extensions[cu13]") {
		t.Errorf("another library: %+v", c)
	}
}

// TestNCCLEPBackward: the high-throughput backward of NCCL EP's contract
// (pass_direction NCCL_EP_BWD_PASS over the forward's handle), on the fake,
// in one process and across processes (FAKENCCL_NET), as nccl_ep's own
// test_ht_bwd.cu checks it: a backward combine of the forward dispatch's
// outputs returns each token's routing weights in its k order and its rows
// summed; a backward dispatch of new rows fills the slots the forward
// filled; a backward combine without its topk_weights is refused; a rank
// in the backward combine while the other is in the forward's fails the
// collective rule; the low-latency mode refuses BWD (ncclInvalidUsage).
func TestNCCLEPBackward(t *testing.T) {
	for _, net := range []bool{false, true} {
		t.Run(map[bool]string{false: "one-process", true: "across-processes"}[net], func(t *testing.T) {
			if net {
				hostsim.SkipIfShort(t, "one-process, and TestNCCLEPAcrossProcesses/all-call")
				t.Setenv("FAKENCCL_NET", "1")
				t.Setenv("FAKENCCL_TIMEOUT_S", "120")
			}
			testEPBackward(t)
		})
	}
}

func testEPBackward(t *testing.T) {
	r := newEPRig(t)
	const rows = 2 * epTokens * epTopK
	weight := func(g, tk, j int) float32 { return 0.125 * float32((g+1)*100+(tk+1)*10+j) }
	var mixed [2]bool // each rank reached the last round (rank 1 calls the forward's combine)
	errs := r.ranks(func(g int) error {
		grp, err := r.e.CreateGroup(r.comm[g], r.config(rows))
		if err != nil {
			return err
		}
		defer r.e.DestroyGroup(grp)
		h, err := r.e.InitHandle(grp, epTopK)
		if err != nil {
			return err
		}
		defer r.e.DestroyHandle(h)
		b := r.buf[g]
		x, w := make([]uint16, epTokens*epHidden), make([]float32, epTokens*epTopK)
		for tk := range epTokens {
			for c := range epHidden {
				x[tk*epHidden+c] = bf16(float32(g*10 + tk + 1))
			}
			for j := range epTopK {
				w[tk*epTopK+j] = weight(g, tk, j)
			}
		}
		if err := CopyToDevice(r.d, b.x, x, r.s[g]); err != nil {
			return err
		}
		if err := CopyToDevice(r.d, b.w, w, r.s[g]); err != nil {
			return err
		}
		counts := EPTensor{b.counts, NCCLInt32, []int{epExperts / 2}}
		total := EPTensor{b.counts + DevicePtr(4*epExperts/2), NCCLInt32, []int{1}}
		if err := r.e.UpdateHandle(h, EPTensor{b.idx, NCCLInt32, []int{epTokens, epTopK}}, counts, total, r.s[g]); err != nil {
			return err
		}
		tok, tw := EPTensor{b.x, NCCLBfloat16, []int{epTokens, epHidden}}, EPTensor{b.w, NCCLFloat32, []int{epTokens, epTopK}}
		out, outW := EPTensor{b.out, NCCLBfloat16, []int{rows, epHidden}}, EPTensor{b.outW, NCCLFloat32, []int{rows}}
		if err := r.e.Dispatch(h, tok, tw, out, outW, EPTensor{}, r.s[g]); err != nil {
			return err
		}
		got := make([]int32, epExperts/2+1)
		if err := CopyFromDevice(r.d, got, b.counts, r.s[g]); err != nil {
			return err
		}
		n := int(got[epExperts/2]) // the received rows: 2 tokens × 2 experts from each rank
		if n != 8 {
			return fmt.Errorf("received %d rows, want 8", n)
		}
		recv := make([]uint16, n*epHidden)
		if err := CopyFromDevice(r.d, recv, b.out, r.s[g]); err != nil {
			return err
		}
		// the backward's combine of the forward's outputs, into new buffers
		dx, err := r.d.Alloc(2 * epTokens * epHidden)
		if err != nil {
			return err
		}
		defer r.d.Free(dx)
		dp, err := r.d.Alloc(4 * epTokens * epTopK)
		if err != nil {
			return err
		}
		defer r.d.Free(dp)
		in, inW := EPTensor{b.out, NCCLBfloat16, []int{n, epHidden}}, EPTensor{b.outW, NCCLFloat32, []int{n}}
		gx, gp := EPTensor{dx, NCCLBfloat16, []int{epTokens, epHidden}}, EPTensor{dp, NCCLFloat32, []int{epTokens, epTopK}}
		if err := r.e.CombineBackward(h, in, EPTensor{}, gx, gp, r.s[g]); err == nil || !strings.Contains(err.Error(), "ncclInvalidArgument") {
			return fmt.Errorf("a backward combine without inputs->topk_weights: %v", err)
		}
		if err := r.e.CombineBackward(h, in, EPTensor{b.outW, NCCLFloat32, []int{n, 1}}, gx, gp, r.s[g]); err == nil || !strings.Contains(err.Error(), "ncclInvalidArgument") {
			return fmt.Errorf("a backward combine with 2D expert-major topk_weights: %v", err)
		}
		if err := r.e.CombineBackward(h, in, inW, gx, gp, r.s[g]); err != nil {
			return err
		}
		sum, probs := make([]uint16, epTokens*epHidden), make([]float32, epTokens*epTopK)
		if err := CopyFromDevice(r.d, sum, dx, r.s[g]); err != nil {
			return err
		}
		if err := CopyFromDevice(r.d, probs, dp, r.s[g]); err != nil {
			return err
		}
		for tk := range epTokens {
			for j := range epTopK {
				if probs[tk*epTopK+j] != w[tk*epTopK+j] {
					return fmt.Errorf("backward combine: token %d's weight %d came back %v, want %v", tk, j, probs[tk*epTopK+j], w[tk*epTopK+j])
				}
			}
			if v, want := unbf16(sum[tk*epHidden]), 2*float32(g*10+tk+1); v != want { // its 2 copies, both on one rank
				return fmt.Errorf("backward combine: token %d's row summed to %v, want %v", tk, v, want)
			}
		}
		// the backward's dispatch of new rows: the forward's slots
		for i := range x {
			x[i] = bf16(unbf16(x[i]) + 100)
		}
		if err := CopyToDevice(r.d, b.x, x, r.s[g]); err != nil {
			return err
		}
		if err := r.e.DispatchBackward(h, tok, out, r.s[g]); err != nil {
			return err
		}
		again := make([]uint16, n*epHidden)
		if err := CopyFromDevice(r.d, again, b.out, r.s[g]); err != nil {
			return err
		}
		for s := range n {
			if v, want := unbf16(again[s*epHidden]), unbf16(recv[s*epHidden])+100; v != want {
				return fmt.Errorf("backward dispatch: slot %d holds %v, want %v (the forward's row there + 100)", s, v, want)
			}
		}
		// the collective rule: one rank in the backward's combine, the other in the forward's
		mixed[g] = true
		if g == 1 {
			err = r.e.Combine(h, in, gx, EPTensor{}, r.s[g])
		} else {
			err = r.e.CombineBackward(h, in, inW, gx, gp, r.s[g])
		}
		if err == nil {
			err = r.d.SyncStream(r.s[g])
		}
		if err == nil || !strings.Contains(err.Error(), "CUDA_ERROR_LAUNCH_FAILED") {
			return fmt.Errorf("a backward combine beside another rank's forward combine: %v (want the GPU failed)", err)
		}
		return nil
	})
	for g, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", g, err)
		}
	}
	if !mixed[0] || !mixed[1] {
		t.Fatalf("the collective rule's round ran on ranks %v", mixed)
	}

	// the low-latency mode: no backward
	r = newEPRig(t)
	errs = r.ranks(func(g int) error {
		c := r.config(0)
		c.Algorithm = EPLowLatency
		grp, err := r.e.CreateGroup(r.comm[g], c)
		if err != nil {
			return err
		}
		defer r.e.DestroyGroup(grp)
		h, err := r.e.InitHandle(grp, epTopK)
		if err != nil {
			return err
		}
		defer r.e.DestroyHandle(h)
		b := r.buf[g]
		if err := r.e.UpdateHandle(h, EPTensor{b.idx, NCCLInt32, []int{epTokens, epTopK}}, EPTensor{}, EPTensor{}, r.s[g]); err != nil {
			return err
		}
		tok := EPTensor{b.x, NCCLBfloat16, []int{epTokens, epHidden}}
		if err := r.e.DispatchBackward(h, tok, EPTensor{b.out, NCCLBfloat16, []int{epExperts / 2, 2 * epTokens, epHidden}}, r.s[g]); err == nil ||
			!strings.Contains(err.Error(), "ncclEpDispatch: ncclInvalidUsage") {
			return fmt.Errorf("a low-latency backward dispatch: %v", err)
		}
		if err := r.e.CombineBackward(h, EPTensor{b.out, NCCLBfloat16, []int{epExperts / 2, 2 * epTokens, epHidden}}, EPTensor{b.outW, NCCLFloat32, []int{8}},
			tok, EPTensor{b.w, NCCLFloat32, []int{epTokens, epTopK}}, r.s[g]); err == nil || !strings.Contains(err.Error(), "ncclEpCombine: ncclInvalidUsage") {
			return fmt.Errorf("a low-latency backward combine: %v", err)
		}
		return nil
	})
	for g, err := range errs {
		if err != nil {
			t.Errorf("low latency, rank %d: %v", g, err)
		}
	}
}

// TestNCCLEPQuantForward: an fp8 dispatch through NCCL EP's
// NCCL_EP_DISP_QUANT_FWD recipe (the dispatch config at its V2 size): e4m3
// tokens [tokens, hidden] and their fp32 scales [tokens, hidden/128]-like
// rows arrive as their bytes, each slot's scale row beside its token row
// (the slots of the bf16 dispatch: by local expert, then source rank and
// token), in one process and across processes; scale rows that are not
// 16-byte multiples are refused, as the header's contract says.
func TestNCCLEPQuantForward(t *testing.T) {
	eachNet(t, func(t *testing.T, net string) {
		if net != "" {
			t.Setenv("FAKENCCL_TIMEOUT_S", "120")
		}
		r := newEPRig(t)
		const S, rows = 4, 2 * epTokens * epTopK // 4 fp32 scales a token: 16 bytes
		for g, err := range r.ranks(func(g int) error {
			grp, err := r.e.CreateGroup(r.comm[g], r.config(rows))
			if err != nil {
				return err
			}
			h, err := r.e.InitHandle(grp, epTopK)
			if err != nil {
				return err
			}
			b := r.buf[g]
			xq, xs := make([]uint8, epTokens*epHidden), make([]float32, epTokens*S)
			for i := range xq {
				xq[i] = uint8(0x40*g + 0x10*(i/epHidden) + i%epHidden)
			}
			for i := range xs {
				xs[i] = float32(100*g + 10*(i/S) + i%S)
			}
			q, s := b.x, b.x+DevicePtr(len(xq))
			if err := CopyToDevice(r.d, q, xq, r.s[g]); err != nil {
				return err
			}
			if err := CopyToDevice(r.d, s, xs, r.s[g]); err != nil {
				return err
			}
			counts := EPTensor{b.counts, NCCLInt32, []int{epExperts / 2}}
			total := EPTensor{b.counts + DevicePtr(4*epExperts/2), NCCLInt32, []int{1}}
			if err := r.e.UpdateHandle(h, EPTensor{b.idx, NCCLInt32, []int{epTokens, epTopK}}, counts, total, r.s[g]); err != nil {
				return err
			}
			tok, w := EPTensor{q, NCCLFloat8e4m3, []int{epTokens, epHidden}}, EPTensor{b.w, NCCLFloat32, []int{epTokens, epTopK}}
			oq, os := b.out, b.out+DevicePtr(rows*epHidden)
			out, outS, outW := EPTensor{oq, NCCLFloat8e4m3, []int{rows, epHidden}}, EPTensor{os, NCCLFloat32, []int{rows, S}}, EPTensor{b.outW, NCCLFloat32, []int{rows}}
			bad := EPTensor{s, NCCLFloat32, []int{epTokens, 2}} // 8-byte scale rows
			if err := r.e.DispatchForward(h, tok, bad, w, out, EPTensor{os, NCCLFloat32, []int{rows, 2}}, outW, EPTensor{}, r.s[g]); err == nil ||
				!strings.Contains(err.Error(), "ncclInvalidArgument") {
				return fmt.Errorf("scale rows of 8 bytes: %v", err)
			}
			if err := r.e.DispatchForward(h, tok, EPTensor{s, NCCLFloat32, []int{epTokens, S}}, w, out, outS, outW, EPTensor{}, r.s[g]); err != nil {
				return err
			}
			if err := r.d.SyncStream(r.s[g]); err != nil {
				return err
			}
			gq, gs := make([]uint8, rows*epHidden), make([]float32, rows*S)
			if err := CopyFromDevice(r.d, gq, oq, r.s[g]); err != nil {
				return err
			}
			if err := CopyFromDevice(r.d, gs, os, r.s[g]); err != nil {
				return err
			}
			// token t goes to experts 2t and 2t+1 on both ranks: rank g's
			// local expert l receives token (4g+l)/2 of rank 0, then rank 1's
			slot := 0
			for l := range epExperts / 2 {
				for src := range 2 {
					tk := (4*g + l) / 2
					for c := range epHidden {
						if want := uint8(0x40*src + 0x10*tk + c); gq[slot*epHidden+c] != want {
							return fmt.Errorf("slot %d token byte %d: %#x, want %#x (rank %d's token %d)", slot, c, gq[slot*epHidden+c], want, src, tk)
						}
					}
					for c := range S {
						if want := float32(100*src + 10*tk + c); gs[slot*S+c] != want {
							return fmt.Errorf("slot %d scale %d: %v, want %v (rank %d's token %d)", slot, c, gs[slot*S+c], want, src, tk)
						}
					}
					slot++
				}
			}
			if err := r.e.DestroyHandle(h); err != nil {
				return err
			}
			return r.e.DestroyGroup(grp)
		}) {
			if err != nil {
				t.Errorf("rank %d: %v", g, err)
			}
		}
	})
}
