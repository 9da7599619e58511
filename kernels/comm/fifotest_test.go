package comm

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moebench/moebench/internal/hostsim"
	"github.com/moebench/moebench/kernels"
	"github.com/moebench/moebench/kernels/device"
)

// fifoCase is one run of fifo_test: rows of hidden bf16 through stages
// slots in blocks blocks, the path (bulk or 16-byte), the consumers'
// mode, a bug and each wait's timeout.
type fifoCase struct {
	hidden, stages, rows, blocks int
	bulk, reduce                 bool
	bug                          int32
	timeout                      time.Duration
}

const fifoWarps = 3 // a producer and two consumers

// runFIFOTest runs c on dev and returns the outputs expected and received
// and the error of the launch or of the synchronisation after it, and the
// kernels' records.
func runFIFOTest(t *testing.T, dev device.Device, c fifoCase) (got, want []uint16, runErr, kernel error) {
	t.Helper()
	ok := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	s, err := dev.NewStream()
	ok(err)
	n := c.rows * c.hidden
	in := randBF16(rand.New(rand.NewPCG(uint64(c.rows), 7)), n)
	want = slices.Clone(in)
	if c.reduce {
		x := kernels.FromBF16Bits(in)
		for i := range x {
			x[i] *= 2
		}
		want = kernels.BF16Bits(x)
	}
	pin, err := dev.Alloc(int64(2 * n))
	ok(err)
	pout, err := dev.Alloc(int64(2 * n))
	ok(err)
	ok(dev.Upload(pin, in, s))
	ok(dev.Fill16(pout, 0x7fc0, int64(n), s))
	sig, err := NewSignals([]device.Device{dev}, []device.Stream{s}, 0)
	ok(err)
	sig.Names = FIFOTestNames
	ok(dev.SyncStream(s))
	reduce := int32(0)
	if c.reduce {
		reduce = 1
	}
	col := device.NewCollective(FIFOTestProgram(c.hidden, c.stages, fifoWarps, c.bulk), 1)
	runErr = dev.LaunchResident(col, c.blocks, s, sig.Comm(dev, c.timeout), int32(c.rows), c.bug, reduce, pin, pout)
	if runErr == nil {
		runErr = dev.SyncStream(s)
	}
	kernel = sig.Err()
	if runErr == nil {
		got = make([]uint16, n)
		ok(dev.Download(got, pout, s))
		ok(dev.Free(pin))
		ok(dev.Free(pout))
		ok(sig.Free())
	}
	return got, want, runErr, kernel
}

// checkFIFO runs the working FIFO on dev, on both paths and in both modes,
// each slot reused many times, and a missing arrive and a byte count too
// large, which end by the waits' timeouts with the wait named.
func checkFIFO(t *testing.T, dev device.Device) {
	for _, bulk := range []bool{true, false} {
		for _, reduce := range []bool{false, true} {
			t.Run(fmt.Sprintf("bulk=%v/reduce=%v", bulk, reduce), func(t *testing.T) {
				var got, want []uint16
				var err, kerr error
				hostsim.Within(t, 30*time.Second, func() {
					got, want, err, kerr = runFIFOTest(t, dev, fifoCase{hidden: 256, stages: 4, rows: 40, blocks: 2, bulk: bulk, reduce: reduce, timeout: 5 * time.Second})
				})
				if err != nil || kerr != nil {
					t.Fatalf("%v; kernels: %v", err, kerr)
				}
				if !slices.Equal(got, want) {
					i := 0
					for got[i] == want[i] {
						i++
					}
					t.Fatalf("word %d (row %d): got %#x, want %#x", i, i/256, got[i], want[i])
				}
			})
		}
	}
	// the consumer's wait for the slot, or the producer's for its reuse
	// (whichever expires first names the rank's record)
	want := []string{"rank 0 timed out in phase get at wait full", "rank 0 timed out in phase put at wait empty"}
	timesOut := func(t *testing.T, c fifoCase) {
		var err, kerr error
		hostsim.Within(t, 30*time.Second, func() { _, _, err, kerr = runFIFOTest(t, dev, c) })
		var ce *CommError
		if err != nil || !errors.As(kerr, &ce) || !ce.Records[0].TimedOut ||
			!slices.ContainsFunc(want, func(w string) bool { return strings.Contains(kerr.Error(), w) }) {
			t.Fatalf("launch %v; kernels %v: want a timeout, one of %q", err, kerr, want)
		}
		t.Log(kerr)
	}
	for _, bulk := range []bool{true, false} {
		t.Run(fmt.Sprintf("no-arrive/bulk=%v", bulk), func(t *testing.T) {
			timesOut(t, fifoCase{hidden: 64, stages: 2, rows: 12, blocks: 1, bulk: bulk, bug: FIFONoArrive, timeout: 200 * time.Millisecond})
		})
	}
	t.Run("long-expect", func(t *testing.T) {
		timesOut(t, fifoCase{hidden: 64, stages: 2, rows: 12, blocks: 1, bulk: true, bug: FIFOLongExpect, timeout: 200 * time.Millisecond})
	})
}

// TestFIFOOnHostSim runs fifo_test on the host simulation, the bulk path
// through mbhost.h's stand-in of cp.async.bulk and mbarriers.
func TestFIFOOnHostSim(t *testing.T) {
	if os.Getenv(fifoChildEnv) != "" {
		t.Skip("the child process of TestFIFOViolations")
	}
	useHostSim(t)
	g, err := device.OpenCUDA(0, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	checkFIFO(t, g)
}

// TestGPUFIFO: fifo_test on a GPU (the bulk path where NVRTC ≥ 12 compiles
// it for sm_90 or newer).
func TestGPUFIFO(t *testing.T) { checkFIFO(t, openPair(t).c) }

const fifoChildEnv = "MOEBENCH_FIFO_CHILD"

// TestFIFOViolations: protocol bugs that the bulk-copy stand-in detects
// fail the launch with the rule named. A failed launch leaves the fake
// GPU's context failed for the rest of the process, as on a GPU, so each
// case runs in a child process of the test binary (TestFIFOViolationChild).
func TestFIFOViolations(t *testing.T) {
	if os.Getenv(fifoChildEnv) != "" {
		t.Skip("the child process")
	}
	if os.Getenv("MOEBENCH_REQUIRE_GPU") == "1" {
		t.Skip("the GPU check runs the kernels on the GPU")
	}
	cache := t.TempDir() // the children's compiled kernels, shared
	for _, c := range []struct {
		name string
		bug  int32
		bulk bool
		want []string // any of them
	}{
		// the messages' ends (which of a rule's two forms shows depends on
		// how the threads interleave)
		{"short-expect", FIFOShortExpect, true, []string{"(arrive.expect_tx's byte count too small)"}},
		{"no-empty-wait/bulk", FIFONoEmptyWait, true, []string{"empty barrier)"}},
		{"no-empty-wait/16-byte", FIFONoEmptyWait, false, []string{"empty barrier)"}},
		{"no-full-wait/bulk", FIFONoFullWait, true, []string{"full barrier)", "holds no published data"}},
		{"no-full-wait/16-byte", FIFONoFullWait, false, []string{"full barrier)", "holds no published data"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.bulk && c.bug != FIFOShortExpect {
				hostsim.SkipIfShort(t, "the 16-byte path's case of the same rule")
			}
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestFIFOViolationChild$", "-test.v")
			cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d,%v,%s", fifoChildEnv, c.bug, c.bulk, cache))
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			done := make(chan error, 1)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			go func() { done <- cmd.Wait() }()
			var err error
			patience := hostsim.Patience(t, 60*time.Second)
			select {
			case err = <-done:
			case <-time.After(patience):
				cmd.Process.Kill()
				t.Fatalf("child still running after %v:\n%s", patience, out.String())
			}
			rule := ""
			for _, l := range strings.Split(out.String(), "\n") {
				if _, r, ok := strings.Cut(l, "bulk-copy rule broken: "); ok {
					rule = r
					break
				}
			}
			if err != nil || !slices.ContainsFunc(c.want, func(w string) bool { return strings.Contains(rule, w) }) {
				t.Fatalf("child: %v; first rule broken %q, want one ending %q:\n%s", err, rule, c.want, out.String())
			}
			t.Log(rule)
		})
	}
}

// TestFIFOViolationChild is one case of TestFIFOViolations: the launch
// must fail (it passes when it does).
func TestFIFOViolationChild(t *testing.T) {
	spec := os.Getenv(fifoChildEnv)
	if spec == "" {
		t.Skip("runs as a child of TestFIFOViolations")
	}
	var bug int32
	var bulk bool
	var cache string
	if _, err := fmt.Sscanf(strings.ReplaceAll(spec, ",", " "), "%d %t %s", &bug, &bulk, &cache); err != nil {
		t.Fatalf("%s=%q: %v", fifoChildEnv, spec, err)
	}
	useHostSim(t)
	g, err := device.OpenCUDA(0, cache)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	var runErr error
	hostsim.Within(t, 40*time.Second, func() {
		_, _, runErr, _ = runFIFOTest(t, g, fifoCase{hidden: 64, stages: 2, rows: 12, blocks: 1, bulk: bulk, bug: bug, timeout: 300 * time.Millisecond})
	})
	if runErr == nil {
		t.Fatal("the launch did not fail")
	}
	t.Log(runErr)
}
