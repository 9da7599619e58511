package main

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moebench/moebench/harness/bench"
	"github.com/moebench/moebench/harness/layer"
	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/internal/hostsim"
	"github.com/moebench/moebench/kernels/device"
	"github.com/moebench/moebench/results"
)

// TestMain also makes the test binary a moebench process of a distributed
// run (MOEBENCH_TEST_PROCESS=1): the CLI with its kernels compiled for the
// CPU, on the fake driver and the fake NCCL the environment names.
func TestMain(m *testing.M) {
	if os.Getenv("MOEBENCH_TEST_PROCESS") == "1" {
		comp, err := hostsim.New()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		var c device.Compiler = comp
		if m := os.Getenv("MOEBENCH_TEST_MUTATE"); m != "" {
			c = &mutating{Compiler: comp, kernel: m}
		}
		device.NewCompiler = func() (device.Compiler, error) { return c, nil }
		agreed := 0
		d, err := time.ParseDuration(os.Getenv("MOEBENCH_TEST_AGREE_DELAY"))
		if err == nil { // a slow agreement on whether to stop
			layer.AgreeHook = func() { agreed++; time.Sleep(d) }
		}
		if os.Getenv("MOEBENCH_TEST_SMALL_BENCH") == "1" { // bench kernels' ceilings at sizes the simulation computes in seconds
			bench.DefaultSizes = bench.Sizes{CopyBytes: 1 << 20, GEMMDim: 64, FlushBytes: 3 << 20}
		}
		args := os.Args[1:]
		if os.Getenv("MOEBENCH_TEST_BAD_ARG") == "1" { // a process launched with other flags than the rest
			args = append(args, "--iters", "many")
		}
		if more := os.Getenv("MOEBENCH_TEST_ARGS"); more != "" { // flags of this process alone (a later one wins)
			args = append(args, strings.Fields(more)...)
		}
		code := run(args, os.Stdout, os.Stderr)
		if layer.AgreeHook != nil {
			fmt.Fprintf(os.Stderr, "moebench test: %d agreements on whether to stop, each delayed %v\n", agreed, d)
		}
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// mutating plants a bug in one kernel of a test process
// (MOEBENCH_TEST_MUTATE names it; mutations lists them): its source is
// changed before it is compiled, and its ID differs from the compiler's so
// that no image of the right source is taken from the kernel cache. A
// kernel whose source no longer holds the text to change fails to compile
// (a mutation that silently did nothing would let a test pass).
type mutating struct {
	device.Compiler
	kernel string
}

// mutations: the kernel's file, the text, and what replaces it.
var mutations = map[string]struct{ file, from, to string }{
	// the input gradient's parts added, then scaled by 1.5 (both loops)
	"input_grad": {"gradadd.cu", "o[q] = f2bf(a[q]);", "o[q] = f2bf(1.5f * a[q]);"},
	// hybridep's inter-domain path: each row packed for another domain
	// (forward: the input's, backward: the output gradient's) at its
	// neighbour's slot, so that it reaches the other domain as another token
	"hybridep_pack_slot": {"hybridep.cu", "he_copy_row(me.send_x + at * XH,", "he_copy_row(me.send_x + (at ^ 1) * XH,"},
}

func (m *mutating) ID() string { return m.Compiler.ID() + " with a planted bug in " + m.kernel }

func (m *mutating) Compile(name, source string, headers map[string]string, options []string) ([]byte, error) {
	mu, ok := mutations[m.kernel]
	if !ok {
		return nil, fmt.Errorf("MOEBENCH_TEST_MUTATE=%s: no such mutation", m.kernel)
	}
	if name == mu.file {
		if !strings.Contains(source, mu.from) {
			return nil, fmt.Errorf("MOEBENCH_TEST_MUTATE=%s: %s no longer holds %q", m.kernel, name, mu.from)
		}
		source = strings.ReplaceAll(source, mu.from, mu.to)
		fmt.Fprintf(os.Stderr, "moebench test: planted a bug in %s (%s)\n", m.kernel, name)
	}
	return m.Compiler.Compile(name, source, headers, options)
}

// proc is one process of a distributed run started by a test.
type proc struct {
	cmd            *exec.Cmd
	stdout, stderr bytes.Buffer
	done           chan error
}

// launch starts world moebench processes as MOEBENCH_RANK/MOEBENCH_WORLD
// launch them, each on a fake node of two fake GPUs (its own fake driver),
// meeting through the fake NCCL's loopback bootstrap (rank 0's unique id in
// the rendezvous file).
func launchProcs(t *testing.T, world int, args ...string) []*proc {
	return launchProcsEnv(t, world, nil, args...)
}

// launchProcsEnv is launchProcs with env(r) added to process r's
// environment.
func launchProcsEnv(t *testing.T, world int, env func(r int) []string, args ...string) []*proc {
	t.Helper()
	var ps []*proc
	for r := range world {
		p := &proc{cmd: exec.Command(os.Args[0], args...), done: make(chan error, 1)}
		p.cmd.Env = append(os.Environ(), "MOEBENCH_TEST_PROCESS=1", fmt.Sprintf("MOEBENCH_RANK=%d", r), fmt.Sprintf("MOEBENCH_WORLD=%d", world),
			"FAKENCCL_TIMEOUT_S=120", "MOEBENCH_DEBUG=1") // the fake waits as NCCL hangs: moebench's own watch must stop the run first
		if env != nil {
			p.cmd.Env = append(p.cmd.Env, env(r)...)
		}
		p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() {
			err := p.cmd.Wait()
			p.done <- err
			close(p.done)
		}()
		ps = append(ps, p)
	}
	t.Cleanup(func() {
		for _, p := range ps {
			p.cmd.Process.Kill()
		}
	})
	return ps
}

// wait waits for p at most d on an idle machine (hostsim.Patience: more
// on a loaded one).
func (p *proc) wait(t *testing.T, d time.Duration) error {
	t.Helper()
	d = hostsim.Patience(t, d)
	select {
	case err := <-p.done:
		return err
	case <-time.After(d):
		t.Fatalf("process still running after %v (a hang?); stderr:\n%s", d, p.stderr.String())
		return nil
	}
}

// runRecord waits for ps, the processes of one run appending to out, and
// returns the run's one record: every process exits 0 (else the others
// are stopped, every stderr logged and the test stops), the processes
// other than rank 0 print nothing and say that rank 0 writes the record,
// and the record passed its check, done by each of the processes.
func runRecord(t *testing.T, out string, ps []*proc) results.Record {
	t.Helper()
	for r, p := range ps {
		if err := p.wait(t, 4*time.Minute); err != nil {
			for _, q := range ps {
				q.cmd.Process.Kill()
				<-q.done
			}
			for q := range ps {
				t.Logf("process %d's stderr:\n%s", q, ps[q].stderr.String())
			}
			t.Fatalf("process %d: %v", r, err)
		}
		if r > 0 && (p.stdout.Len() > 0 || !strings.Contains(p.stderr.String(), "rank 0 writes the record")) {
			t.Errorf("process %d wrote %q; stderr %q", r, p.stdout.String(), p.stderr.String())
		}
	}
	recs, err := results.ReadFile(out, nil)
	if err != nil || len(recs) != 1 {
		t.Fatalf("%d records, %v", len(recs), err)
	}
	rec := recs[0]
	if c := rec.Correctness; rec.Status != results.StatusOK || c == nil || !c.Passed || !strings.Contains(c.Sample, fmt.Sprintf("each of the %d processes", len(ps))) {
		t.Fatalf("record: status %s (%s), %+v", rec.Status, rec.Reason, c)
	}
	return rec
}

// distributedSetup prepares the fakes and returns the run's files.
func distributedSetup(t *testing.T) (rv, out string) {
	hostsim.Setup(t)
	dir := t.TempDir()
	nccl, err := hostsim.BuildFake("fakenccl", dir, "libnccl.so.2")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("MOEBENCH_NCCL", nccl)
	return filepath.Join(dir, "rendezvous"), filepath.Join(dir, "runs.jsonl")
}

// TestDistributedRun: the whole layer with alltoall --impl library at EP 4
// over 2 processes and at EP 8 over 4, each process driving two fake GPUs
// from a thread each, NCCL's communicator over every rank made with its
// own bootstrap (rank 0's unique id through --rendezvous): every process
// exits 0, rank 0 alone writes one record, which passes the float64 check
// (every process checked its ranks) and maps every rank to its process,
// node and GPU.
//
// TestDistributedKilledProcess (a subtest, sharing the kernels the first
// run compiled): a process killed during the steps makes the other exit
// within --comm-timeout, naming the killed process's ranks, where NCCL (the
// fake, which waits 120 s) would hang.
func TestDistributedRun(t *testing.T) {
	hostsim.SkipIfShort(t, "TestDistributedCommIDUnarrived (processes meeting in NCCL) and the harness's TestCUDALayerOnHostSim (the layer on the fake GPUs)")
	rv, out := distributedSetup(t)
	for _, c := range []struct {
		ep, world int
		nodes     bool // each process names its own node (MOEBENCH_NODE); else all are on this machine's
	}{{4, 2, true}, {8, 4, false}} {
		t.Run(fmt.Sprintf("ep%d-over-%d", c.ep, c.world), func(t *testing.T) {
			os.Remove(out)
			var env func(int) []string
			if c.nodes {
				env = func(r int) []string { return []string{fmt.Sprintf("MOEBENCH_NODE=node-%d", r)} }
			}
			ps := launchProcsEnv(t, c.world, env, "--device", "cuda", "--dispatcher", "alltoall", "--impl", "library", "--ep", fmt.Sprint(c.ep),
				"--experts", "16", "--tokens", "16", "--hidden", "32", "--ffn", "16", "--warmup", "1", "--iters", "2",
				"--rendezvous", rv, "--out", out, "--format", "json", "--comm-timeout", commTimeout(t))
			rec := runRecord(t, out, ps)
			// the training step: forward and backward timed, every gradient
			// checked (each process its own ranks', the router's and shared
			// expert's summed over the processes)
			if rec.Config.Pass != results.PassTraining || rec.Config.PassNote != "" || rec.Timing.Forward == nil || rec.Timing.Backward == nil ||
				!(rec.Timing.Backward.P50 > 0) || !(rec.Timing.Step.P50 > 0) {
				t.Fatalf("pass %q (%q), timing fwd %+v bwd %+v", rec.Config.Pass, rec.Config.PassNote, rec.Timing.Forward, rec.Timing.Backward)
			}
			g := rec.Correctness.Grads
			if g == nil || !(g.MaxRelErr <= g.Tolerance) || len(g.PerTensor) != 7 || !strings.Contains(g.Note, "each process compares its own ranks'") {
				t.Fatalf("gradient check %+v", g)
			}
			for n, e := range g.PerTensor {
				if !(e > 0 && e <= g.Tolerance) { // 0 would be a gradient compared with nothing
					t.Errorf("gradient %s: error %g", n, e)
				}
			}
			bwd := 0
			for _, ph := range rec.Timing.Phases {
				if strings.HasSuffix(ph.Name, "-bwd") {
					bwd++
				}
			}
			if bwd < 5 || rec.Memory == nil || len(rec.Memory.SavedPerRankBytes) != c.ep {
				t.Errorf("%d backward phases; memory %+v", bwd, rec.Memory)
			}
			if len(rec.Ranks.Processes) != c.world || len(rec.Ranks.Devices) != c.ep || rec.Ranks.Launch == "" {
				t.Fatalf("ranks %+v", rec.Ranks)
			}
			for p, pr := range rec.Ranks.Processes {
				if pr.Process != p || fmt.Sprint(pr.Ranks) != fmt.Sprint([]int{2 * p, 2*p + 1}) || fmt.Sprint(pr.GPUs) != "[0 1]" || len(pr.StackDiffers) > 0 {
					t.Errorf("process %d: %+v", p, pr)
				}
			}
			for _, ph := range rec.Timing.Phases {
				if len(ph.PerRank) != c.ep {
					t.Errorf("%s: %d ranks' times", ph.Name, len(ph.PerRank))
				}
				for r, v := range ph.PerRank {
					if !(v > 0) {
						t.Errorf("%s: rank %d's time %v", ph.Name, r, v)
					}
				}
			}
			if rec.Traffic == nil || rec.Traffic.DispatchOffRank == 0 || len(rec.Tokens.Received) != c.ep {
				t.Fatalf("traffic %+v, tokens %+v", rec.Traffic, rec.Tokens)
			}
			// inter- and intra-node bytes: (token, rank) pairs, at most
			// alltoall's off-rank (token, expert) copies' rows
			tr, row := rec.Traffic, int64(2*32)
			var table bytes.Buffer
			results.Write(&table, &rec, "table")
			if tr.IntraNodeBytes == 0 || (tr.InterNodeBytes > 0) != c.nodes || tr.InterNodeBytes+tr.IntraNodeBytes > tr.DispatchOffRank/(row+4)*row ||
				(tr.DispatchInterNodeGBps > 0) != c.nodes || strings.Contains(table.String(), "inter-node") != c.nodes {
				t.Errorf("nodes %v: inter-node %d, intra-node %d, off-rank rows %d bytes; %.3f GB/s; table:\n%s", c.nodes, tr.InterNodeBytes, tr.IntraNodeBytes,
					tr.DispatchOffRank/(row+4)*row, tr.DispatchInterNodeGBps, table.String())
			}
			if c.nodes && rec.Ranks.Processes[1].Host != "node-1" {
				t.Errorf("process 1's node %q", rec.Ranks.Processes[1].Host)
			}
			t.Logf("%s; max rel err %.2e, gradients %.2e", rec.Ranks.Note, rec.Correctness.MaxRelErr, g.MaxRelErr)
		})
	}
	t.Run("wrong-gradient-on-process-1", func(t *testing.T) { wrongGradient(t, rv, out) })
	t.Run("same-as-one-process", func(t *testing.T) { sameAsOneProcess(t, rv, out) })
	t.Run("trace-routing", func(t *testing.T) { traceRouting(t, rv, out) })
	t.Run("sweep", func(t *testing.T) { distributedSweep(t, rv, out) })
	t.Run("gpu-check", gpuCheckTwoProcesses)
	t.Run("nightly", nightlyTwoProcesses)
	t.Run("killed", func(t *testing.T) { killedProcess(t, rv, out) })
}

// distributedSweep: moebench sweep launched over 2 processes runs the same
// points in the same order on both, and rank 0 alone writes one file with
// one record per point. With NCCL missing on process 1 alone, every point
// is unavailable on both (agreed before they meet in NCCL), rank 0's
// records name process 1, and neither waits in NCCL for the other.
func distributedSweep(t *testing.T, rv, out string) {
	args := []string{"sweep", "--device", "cuda", "--dispatcher", "alltoall", "--impl", "library", "--ep", "4", "--routings", "balanced,uniform",
		"--experts", "16", "--tokens", "16", "--hidden", "32", "--ffn", "16", "--warmup", "1", "--iters", "2",
		"--rendezvous", rv, "--out", out, "--comm-timeout", commTimeout(t)}
	for _, c := range []struct {
		name   string
		env    func(r int) []string
		status string
	}{
		{"both-ready", nil, results.StatusOK},
		{"no-nccl-on-process-1", func(r int) []string {
			if r == 1 {
				return []string{"MOEBENCH_NCCL=" + filepath.Join(filepath.Dir(rv), "missing", "libnccl.so.2")}
			}
			return nil
		}, results.StatusUnavailable},
	} {
		t.Run(c.name, func(t *testing.T) {
			os.Remove(out)
			ps := launchProcsEnv(t, 2, c.env, args...)
			for r, p := range ps {
				if err := p.wait(t, 4*time.Minute); err != nil {
					t.Fatalf("%s: process %d: %v; stderr:\n%s\nprocess 0's:\n%s", c.name, r, err, p.stderr.String(), ps[0].stderr.String())
				}
			}
			if !strings.Contains(ps[1].stderr.String(), "rank 0 writes "+out) || strings.Count(ps[1].stderr.String(), "[") < 2 {
				t.Errorf("%s: process 1's stderr:\n%s", c.name, ps[1].stderr.String())
			}
			recs, err := results.ReadFile(out, nil)
			if err != nil || len(recs) != 2 {
				t.Fatalf("%s: %d records, %v; stderr:\n%s", c.name, len(recs), err, ps[0].stderr.String())
			}
			for i, rec := range recs {
				if rec.Status != c.status || rec.Config.Routing != []string{"balanced", "uniform"}[i] {
					t.Errorf("%s: record %d: %s %s: %s", c.name, i, rec.Config.Routing, rec.Status, rec.Reason)
				}
				if c.status == results.StatusOK && (len(rec.Ranks.Processes) != 2 || rec.Config.Pass != results.PassTraining || rec.Correctness.Grads == nil || !rec.Correctness.Passed) {
					t.Errorf("%s: record %d: pass %s, processes %+v, correctness %+v", c.name, i, rec.Config.Pass, rec.Ranks.Processes, rec.Correctness)
				}
				if c.status != results.StatusOK && !strings.Contains(rec.Reason, "ranks 2–3 (process 1 of 2") {
					t.Errorf("%s: record %d's reason does not name process 1: %s", c.name, i, rec.Reason)
				}
			}
			t.Logf("%s: %s: %s", c.name, recs[1].Status, recs[1].Reason)
		})
	}
}

// sameAsOneProcess: the same layer at EP 2 on the fake node's two GPUs,
// run by one process and by two (one rank each), checks the same: the
// output's error and every gradient's are the same numbers (each process
// checks its own rank, the router's and shared expert's sums come from
// both over NCCL, and the run's errors are taken over both processes'
// maxima as one process takes them over its ranks').
func sameAsOneProcess(t *testing.T, rv, out string) {
	args := []string{"--device", "cuda", "--dispatcher", "alltoall", "--impl", "library", "--ep", "2",
		"--experts", "16", "--tokens", "16", "--hidden", "32", "--ffn", "16", "--warmup", "1", "--iters", "2", "--format", "json", "--comm-timeout", commTimeout(t)}
	one := filepath.Join(t.TempDir(), "one.jsonl")
	cmd := exec.Command(os.Args[0], append(slices.Clone(args), "--out", one)...)
	cmd.Env = append(os.Environ(), "MOEBENCH_TEST_PROCESS=1", "FAKENCCL_TIMEOUT_S=120")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("one process: %v\n%s", err, b)
	}
	os.Remove(out)
	ps := launchProcs(t, 2, append(slices.Clone(args), "--rendezvous", rv, "--out", out)...)
	for r, p := range ps {
		if err := p.wait(t, 4*time.Minute); err != nil {
			t.Fatalf("process %d: %v; stderr:\n%s", r, err, p.stderr.String())
		}
	}
	var recs [2]results.Record
	for i, f := range []string{one, out} {
		rs, err := results.ReadFile(f, nil)
		if err != nil || len(rs) != 1 || rs[0].Status != results.StatusOK || rs[0].Correctness.Grads == nil {
			t.Fatalf("%s: %d records, %v", f, len(rs), err)
		}
		recs[i] = rs[0]
	}
	if len(recs[0].Ranks.Processes) != 0 || len(recs[1].Ranks.Processes) != 2 {
		t.Fatalf("processes: one %+v, two %+v", recs[0].Ranks.Processes, recs[1].Ranks.Processes)
	}
	same := func(a, b float64) bool { return a > 0 && math.Abs(a-b) <= 1e-9*a } // the float64 reference adds experts' parts in the order they finish
	c1, c2 := recs[0].Correctness, recs[1].Correctness
	if !same(c1.MaxRelErr, c2.MaxRelErr) || len(c1.Grads.PerTensor) != 7 || len(c2.Grads.PerTensor) != 7 {
		t.Errorf("outputs: one process %g, two %g; gradients %v and %v", c1.MaxRelErr, c2.MaxRelErr, c1.Grads.PerTensor, c2.Grads.PerTensor)
	}
	for n, e := range c1.Grads.PerTensor {
		if !same(e, c2.Grads.PerTensor[n]) {
			t.Errorf("%s: one process %.17g, two %.17g", n, e, c2.Grads.PerTensor[n])
		}
	}
	t.Logf("one process and two: outputs %.3e, gradients %v", c1.MaxRelErr, c1.Grads.PerTensor)
}

// traceRouting: a trace's routing and probabilities (no router gradient)
// over 2 processes: each process's experts' reference takes the other
// process's routing and given probabilities (gathered over NCCL), and the
// run passes its gradient check with the router weight's gradient zero.
func traceRouting(t *testing.T, rv, out string) {
	trace := filepath.Join(t.TempDir(), "trace.txt")
	var b strings.Builder
	g := rand.New(rand.NewPCG(1, 2))
	for range 64 { // top-4 of 16 experts, drawn per token
		e := g.Perm(16)
		fmt.Fprintf(&b, "%d:0.4 %d:0.3 %d:0.2 %d:0.1\n", e[0], e[1], e[2], e[3])
	}
	if err := os.WriteFile(trace, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Remove(out)
	ps := launchProcs(t, 2, "--device", "cuda", "--dispatcher", "alltoall", "--impl", "library", "--ep", "4", "--routing", "trace:"+trace,
		"--experts", "16", "--tokens", "16", "--hidden", "32", "--ffn", "16", "--warmup", "1", "--iters", "2",
		"--rendezvous", rv, "--out", out, "--format", "json", "--comm-timeout", commTimeout(t))
	for r, p := range ps {
		if err := p.wait(t, 4*time.Minute); err != nil {
			t.Fatalf("process %d: %v; stderr:\n%s", r, err, p.stderr.String())
		}
	}
	recs, err := results.ReadFile(out, nil)
	if err != nil || len(recs) != 1 {
		t.Fatalf("%d records, %v", len(recs), err)
	}
	c := recs[0].Correctness
	if recs[0].Status != results.StatusOK || c.Grads == nil || !c.Passed || c.Grads.PerTensor["router weight"] != 0 || !(c.Grads.PerTensor["expert fc1"] > 0) {
		t.Fatalf("record %s: %+v, gradients %+v", recs[0].Status, c, c.Grads)
	}
}

// wrongGradient: process 1 of 2 runs a planted bug in the kernel that adds
// the input gradient's parts (input_grad, its output scaled by 1.5: a
// wrong gradient of its own ranks' tokens that no other process sees, its
// outputs right): rank 0's one record fails the run naming process 1 and
// the input gradient, and every process exits 1.
// commTimeout is the --comm-timeout of a test's processes: 20 s on an
// idle machine, more where MOEBENCH_TEST_TIMEOUT_SCALE or the time left
// before go test's deadline allow (hostsim.Patience), at most the flag's
// 1h: on a loaded machine a process can spend longer than 20 s compiling
// its kernels in its first step while the other waits (seen at load
// average 20–30: wrong-gradient-on-process-1 failed so). A test of the
// timeout itself gives its own.
func commTimeout(t testing.TB) string {
	return min(hostsim.Patience(t, 20*time.Second), time.Hour).Round(time.Second).String()
}

func wrongGradient(t *testing.T, rv, out string) {
	os.Remove(out)
	ps := launchProcsEnv(t, 2, func(r int) []string {
		if r == 1 {
			return []string{"MOEBENCH_TEST_MUTATE=input_grad"}
		}
		return nil
	}, "--device", "cuda", "--dispatcher", "alltoall", "--impl", "library", "--ep", "4",
		"--experts", "16", "--tokens", "16", "--hidden", "32", "--ffn", "16", "--warmup", "1", "--iters", "2",
		"--rendezvous", rv, "--out", out, "--format", "json", "--comm-timeout", commTimeout(t))
	for r, p := range ps {
		if err := p.wait(t, 4*time.Minute); err == nil {
			t.Errorf("process %d exited 0; stderr:\n%s", r, p.stderr.String())
		}
	}
	if !strings.Contains(ps[1].stderr.String(), "moebench test: planted ") {
		t.Fatalf("process 1 ran no planted bug; stderr:\n%s", ps[1].stderr.String())
	}
	recs, err := results.ReadFile(out, nil)
	if err != nil || len(recs) != 1 {
		t.Fatalf("%d records, %v; process 0's stderr:\n%s", len(recs), err, ps[0].stderr.String())
	}
	c := recs[0].Correctness
	if recs[0].Status != results.StatusFailed || c == nil || c.Passed || c.Grads == nil || !(c.MaxRelErr <= c.Tolerance) ||
		!(c.Grads.PerTensor["input"] > 0.3) || !strings.HasPrefix(c.Detail, "gradient error over the tolerance 0.02: input ") ||
		!strings.HasSuffix(c.Detail, "(input in process(es) 1)") || recs[0].Timing != nil {
		t.Fatalf("record: %s: %s; correctness %+v, gradients %+v", recs[0].Status, recs[0].Reason, c, c.Grads)
	}
	for n, e := range c.Grads.PerTensor {
		if n != "input" && !(e <= c.Grads.Tolerance) {
			t.Errorf("gradient %s: error %g (only the input gradient is wrong)", n, e)
		}
	}
	t.Logf("rank 0's record: %s", recs[0].Reason)
}

// TestDistributedCommIDUnarrived: with NCCL_COMM_ID alone (no
// --rendezvous, nothing shared but NCCL), a process that never reaches
// NCCL's communicator setup (launched with a bad argument, it exits at
// once) makes the others exit 1 within --comm-timeout of their own
// arrival — not the fake NCCL's 120 s, where NCCL would hang — saying
// what they know: their own ranks joined, and which other processes' did
// not: named where it is the only other process, else every candidate,
// with --rendezvous suggested. When NCCL's own bootstrap gives up first
// (the fake's timeout under --comm-timeout), its error says the same.
func TestDistributedCommIDUnarrived(t *testing.T) {
	distributedSetup(t)
	for _, c := range []struct {
		name        string
		world, bad  int    // processes, and the one launched with a bad argument
		fakeTimeout string // FAKENCCL_TIMEOUT_S: NCCL's bootstrap timeout
		commTimeout string
		want        []string // in every other process's stderr
		wantOf      map[int][]string
		most        time.Duration // a survivor's whole run at most
		notWant     string
	}{
		{name: "two-processes", world: 2, bad: 1, fakeTimeout: "120", commTimeout: "8s",
			want: []string{"ranks 0–1 (process 0 of 2 on", "waited 8s in NCCL's communicator setup", "this process's ranks joined NCCL's communicator setup at NCCL_COMM_ID=127.0.0.1:",
				"process 1 (ranks 2–3), the run's only other process, never joined it", "--rendezvous FILE"},
			most: 40 * time.Second},
		{name: "rank-0-missing", world: 2, bad: 0, fakeTimeout: "120", commTimeout: "8s",
			want: []string{"ranks 2–3 (process 1 of 2 on", "waited 8s in NCCL's communicator setup", "process 0 (ranks 0–1), the run's only other process, never joined it"},
			most: 40 * time.Second},
		{name: "three-processes", world: 3, bad: 1, fakeTimeout: "120", commTimeout: "8s",
			// process 2 stops by its watch too, or by NCCL's error once process 0 (the root) left
			want: []string{"this process's ranks joined NCCL's communicator setup at NCCL_COMM_ID=127.0.0.1:", "one or more never joined it", "NCCL's bootstrap does not say which",
				"--rendezvous FILE (a path every node sees) makes every process name it"},
			wantOf: map[int][]string{0: {"ranks 0–1 (process 0 of 3", "waited 8s in NCCL's communicator setup", "of process 1 (ranks 2–3), process 2 (ranks 4–5), one or more"},
				2: {"ranks 4–5 (process 2 of 3", "of process 0 (ranks 0–1), process 1 (ranks 2–3), one or more"}},
			most: 40 * time.Second},
		{name: "nccls-own-timeout", world: 2, bad: 1, fakeTimeout: "4", commTimeout: "5m",
			want: []string{"ranks 0–1 (process 0 of 2 on", "ncclCommInitRank: rank 0 waited 4 s for the other ranks of 4 (2 joined)",
				"process 1 (ranks 2–3), the run's only other process, never joined it"},
			most: 35 * time.Second, notWant: "waited 5m"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.name == "rank-0-missing" || c.name == "three-processes" {
				hostsim.SkipIfShort(t, "two-processes and nccls-own-timeout")
			}
			l, err := net.Listen("tcp", "127.0.0.1:0") // a free port for NCCL's bootstrap root
			if err != nil {
				t.Fatal(err)
			}
			port := l.Addr().(*net.TCPAddr).Port
			l.Close()
			ep := 2 * c.world
			start := time.Now()
			ps := launchProcsEnv(t, c.world, func(r int) []string {
				env := []string{fmt.Sprintf("NCCL_COMM_ID=127.0.0.1:%d", port), "FAKENCCL_TIMEOUT_S=" + c.fakeTimeout}
				if r == c.bad {
					env = append(env, "MOEBENCH_TEST_BAD_ARG=1")
				}
				return env
			}, "--device", "cuda", "--dispatcher", "alltoall", "--impl", "library", "--ep", fmt.Sprint(ep),
				"--experts", fmt.Sprint(4*ep), "--tokens", "16", "--hidden", "32", "--ffn", "16", "--warmup", "1", "--iters", "2", "--comm-timeout", c.commTimeout)
			for r, p := range ps {
				err := p.wait(t, 3*time.Minute)
				took := time.Since(start)
				msg := p.stderr.String()
				if r == c.bad {
					if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(msg, "--iters") {
						t.Errorf("process %d (bad argument): %v; stderr:\n%s", r, err, msg)
					}
					continue
				}
				if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || took > c.most {
					t.Errorf("process %d: %v after %v; stderr:\n%s", r, err, took, msg)
				}
				for _, w := range append(slices.Clone(c.want), c.wantOf[r]...) {
					if !strings.Contains(msg, w) {
						t.Errorf("process %d's stderr lacks %q:\n%s", r, w, msg)
					}
				}
				if c.notWant != "" && strings.Contains(msg, c.notWant) {
					t.Errorf("process %d's stderr holds %q:\n%s", r, c.notWant, msg)
				}
				t.Logf("process %d after %v: %s", r, took.Round(time.Millisecond), msg)
			}
		})
	}
}

func killedProcess(t *testing.T, rv, out string) {
	killedProcessOf(t, rv, out, "--dispatcher", "alltoall", "--impl", "library")
}

// killedProcessOf is killedProcess with the dispatcher's flags (after the
// default shape's: a shape flag among them replaces its default).
func killedProcessOf(t *testing.T, rv, out string, dispatcher ...string) {
	os.Remove(out)
	ps := launchProcs(t, 2, append([]string{"--device", "cuda", "--ep", "4",
		"--experts", "16", "--tokens", "16", "--hidden", "32", "--ffn", "16", "--warmup", "0", "--iters", "100000",
		"--rendezvous", rv, "--out", out, "--comm-timeout", "10s", "--ncclep-timeout", "10s"}, dispatcher...)...)
	status := rv + ".p1.status"
	deadline := time.Now().Add(3 * time.Minute)
	for { // until process 1 is in its steps: its status names one of the layer's phases (sampled twice a second)
		b, _ := os.ReadFile(status)
		if strings.Contains(string(b), "dispatch") || strings.Contains(string(b), "experts") {
			break
		}
		if time.Now().After(deadline) {
			for _, p := range ps { // stopped before their output is read
				p.cmd.Process.Kill()
				<-p.done
			}
			t.Fatalf("process 1 never reached a step; stderr:\n%s\n%s", ps[0].stderr.String(), ps[1].stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	ps[1].cmd.Process.Kill()
	killed := time.Now()
	err := ps[0].wait(t, time.Minute)
	took := time.Since(killed)
	msg := ps[0].stderr.String()
	if err == nil || !strings.Contains(msg, "ranks 2–3 (process 1 of 2") || took > 12*time.Second {
		t.Fatalf("after %v: %v; stderr:\n%s", took, err, msg)
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("a record was written for a run that failed")
	}
	t.Logf("process 0 stopped %v after the kill: %s", took.Round(time.Millisecond), strings.TrimSpace(msg[strings.LastIndex(strings.TrimSpace(msg), "\n")+1:]))
}

// gpuCheckTwoproc runs scripts/gpu-check.sh's run over two processes (its
// step twoproc) on a node whose nvidia-smi lists two GPUs (a fake one, and
// this test binary as moebench on the fake driver), a small layer of the
// hidden size in hidden ("--hidden N"); it returns the check's folder and
// its output, and fails the test when the script does.
func gpuCheckTwoproc(t *testing.T, hidden string) (out string, b []byte) {
	dir := t.TempDir()
	smi := filepath.Join(dir, "path", "nvidia-smi")
	os.MkdirAll(filepath.Dir(smi), 0o755)
	os.WriteFile(smi, []byte("#!/bin/sh\necho 'GPU 0: Fake GPU 0 (UUID: a)'\necho 'GPU 1: Fake GPU 1 (UUID: b)'\n"), 0o755)
	out = filepath.Join(dir, "out")
	os.MkdirAll(out, 0o755)
	os.Symlink(os.Getenv("MOEBENCH_CACHE"), filepath.Join(out, "kernel-cache")) // the kernels the runs before compiled
	cmd := exec.Command("bash", "../../scripts/gpu-check.sh", "twoproc", out)
	cmd.Env = append(os.Environ(), "MOEBENCH_TEST_PROCESS=1", "MOEBENCH_BIN="+os.Args[0], "PATH="+filepath.Dir(smi)+":"+os.Getenv("PATH"),
		"TWOPROC_FLAGS=--experts 16 --tokens 16 "+hidden+" --ffn 16 --warmup 1 --iters 2 --comm-timeout "+commTimeout(t)+" --ncclep-timeout "+commTimeout(t), "TWOPROC_HYBRIDEP_FLAGS=--sms 2",
		"FAKENCCL_TIMEOUT_S=120")
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v:\n%s", err, b)
	}
	return out, b
}

// gpuCheckTwoProcesses: scripts/gpu-check.sh's run over two processes, on
// a node whose nvidia-smi lists two GPUs (a fake one, and this test binary
// as moebench on the fake driver): EP 2, each process driving one GPU,
// alltoall through NCCL, then hybridep natively with each process one
// domain; each step passes, each process's log is kept beside the step's,
// and rank 0 appended each run's one record to the check's records.
func gpuCheckTwoProcesses(t *testing.T) {
	out, b := gpuCheckTwoproc(t, "--hidden 32")
	names := []string{"twoproc-alltoall-nccl-ep2", "twoproc-hybridep-ep2-d1"}
	if !strings.Contains(string(b), "exit 0") {
		t.Fatalf("no exit 0:\n%s", b)
	}
	for _, name := range names {
		if !strings.Contains(string(b), name+" ") {
			t.Errorf("no %s in the output:\n%s", name, b)
		}
		for _, f := range []string{name + ".log", name + ".p0.log", name + ".p1.log"} {
			if _, err := os.Stat(filepath.Join(out, f)); err != nil {
				t.Error(err)
			}
		}
	}
	recs, err := results.ReadFile(filepath.Join(out, "records.jsonl"), nil)
	if err != nil || len(recs) != 2 {
		t.Fatalf("%d records, %v; output:\n%s", len(recs), err, b)
	}
	for i, d := range []string{"alltoall", "hybridep"} {
		if rec := recs[i]; rec.Config.Dispatcher != d || rec.Status != results.StatusOK || rec.Config.EP != 2 || len(rec.Ranks.Processes) != 2 {
			t.Errorf("record %d: %s %s: %s", i, rec.Config.Dispatcher, rec.Status, rec.Reason)
		}
	}
}

// nightlyTwoProcesses: scripts/nightly.sh started as a launcher starts it,
// once per process (MOEBENCH_RANK/MOEBENCH_WORLD), over a shared nightly
// folder: both run the sweep, rank 0 alone writes the night's run (one
// file, one record per point), the history and the baseline; the other
// exits with its sweep's status.
func nightlyTwoProcesses(t *testing.T) {
	dir := t.TempDir()
	sweep := filepath.Join(dir, "sweep.json")
	os.WriteFile(sweep, []byte(`{"dispatcher": ["alltoall"], "impl": ["library"], "ep": [2], "routing": ["balanced", "uniform"],
		"experts": 16, "tokens": 16, "hidden": 32, "ffn": 16, "iters": 2, "warmup": 1, "device": "cuda", "comm-timeout": "`+commTimeout(t)+`"}`), 0o644)
	night := filepath.Join(dir, "nightly")
	type result struct {
		code int
		out  string
	}
	done := make(chan result, 2)
	for r := range 2 {
		cmd := exec.Command("bash", "../../scripts/nightly.sh", sweep)
		cmd.Env = append(os.Environ(), "MOEBENCH_TEST_PROCESS=1", "MOEBENCH_BIN="+os.Args[0], "MOEBENCH_NIGHTLY_DIR="+night,
			fmt.Sprintf("MOEBENCH_RANK=%d", r), "MOEBENCH_WORLD=2", fmt.Sprintf("MOEBENCH_LOCAL_RANK=%d", r), "FAKENCCL_TIMEOUT_S=120")
		go func() {
			out, err := cmd.CombinedOutput()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				code = -1
			}
			done <- result{code, fmt.Sprintf("process %d: %s", r, out)}
		}()
	}
	var outs []string
	for range 2 {
		select {
		case res := <-done:
			outs = append(outs, res.out)
			if res.code != 0 {
				t.Errorf("exit %d: %s", res.code, res.out)
			}
		case <-time.After(4 * time.Minute):
			t.Fatalf("nightly.sh still running after 4 minutes: %v", outs)
		}
	}
	all := strings.Join(outs, "\n")
	if !strings.Contains(all, "this run is now") || !strings.Contains(all, "process 1 of 2: sweep exit 0; rank 0 writes the run") {
		t.Errorf("output:\n%s", all)
	}
	runs, _ := filepath.Glob(filepath.Join(night, "runs", "*.jsonl"))
	if len(runs) != 1 {
		t.Fatalf("runs %v; output:\n%s", runs, all)
	}
	for _, f := range []string{runs[0], filepath.Join(night, "history.jsonl")} {
		if recs, err := results.ReadFile(f, nil); err != nil || len(recs) != 2 || recs[0].Status != results.StatusOK || len(recs[1].Ranks.Processes) != 2 {
			t.Errorf("%s: %d records, %v", f, len(recs), err)
		}
	}
}

// TestDistributedDumpRefused: --dump in a run over several processes is a
// usage error naming the flag and the launch, before anything runs or is
// written (each process holds only its own ranks' tensors).
func TestDistributedDumpRefused(t *testing.T) {
	t.Setenv("MOEBENCH_RANK", "1")
	t.Setenv("MOEBENCH_WORLD", "2")
	t.Setenv("NCCL_COMM_ID", "127.0.0.1:1")
	dump := filepath.Join(t.TempDir(), "dump")
	code, out, e := cli("--device", "cuda", "--dispatcher", "alltoall", "--impl", "library", "--ep", "4", "--dump", dump)
	if code != exitUsage || out != "" || !strings.Contains(e, "--dump="+dump+": does not apply to a run over 2 processes (MOEBENCH_RANK/MOEBENCH_WORLD") {
		t.Errorf("exit %d; stdout %q; stderr %q", code, out, e)
	}
	if _, err := os.Stat(dump); err == nil {
		t.Errorf("--dump %s was created", dump)
	}
}

// TestDistributedNCCLEP: NCCL EP's two modes — hybridep --impl library
// (high throughput) and deepep-ll --impl library (low latency) — at EP 4 over
// 2 processes, each process on a fake node of two fake GPUs: NCCL EP's
// group is created over the run's communicator (each process its own
// ranks'), and the fake libnccl_ep moves every row between the processes
// through the fake NCCL's loopback send/recv. Every process exits 0, rank
// 0 alone writes one record, which passes the float64 check, says where
// the data moved (inter-node bytes: each process is a node) and which
// library moved it. The high-throughput mode runs a training step across
// the processes (its backward: the library's pass_direction BWD dispatch
// and combine), whose gradients pass the gradient check; the low-latency
// mode times the forward with its reason.
//
// gpu-check (a subtest): scripts/gpu-check.sh's two-process step, on a
// node where doctor finds NCCL EP, runs its two modes as it runs alltoall.
//
// killed (a subtest): a process killed during the steps makes the other
// exit naming it within --comm-timeout, where NCCL EP (the fake's transport
// waits 120 s) would hang.
func TestDistributedNCCLEP(t *testing.T) {
	hostsim.SkipIfShort(t, "TestDistributedCommIDUnarrived (processes meeting in NCCL) and the harness's TestCUDALayerOnHostSim (the layer on the fake GPUs)")
	rv, out := distributedSetup(t)
	ep, err := hostsim.BuildFake("fakencclep", t.TempDir(), "libnccl_ep.so.0")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("MOEBENCH_NCCL_EP", ep)
	t.Setenv("FAKENCCL_VERSION", "23007") // NCCL with the Device API
	hostsim.FakeNCCLEPRuntime(t)
	shape := []string{"--experts", "16", "--tokens", "16", "--hidden", "128", "--ffn", "16"} // the low-latency combine takes 128-multiples
	for _, c := range []struct{ dispatcher, design, pass string }{
		{"hybridep", "HybridEP's design via NCCL EP", ""}, // a training step
		{"deepep-ll", "DeepEP low-latency design via NCCL EP", "NCCL EP's low-latency mode has no backward pass"},
	} {
		t.Run(c.dispatcher, func(t *testing.T) {
			os.Remove(out)
			ps := launchProcsEnv(t, 2, func(r int) []string { return []string{fmt.Sprintf("MOEBENCH_NODE=node-%d", r)} },
				append([]string{"--device", "cuda", "--dispatcher", c.dispatcher, "--impl", "library", "--ep", "4", "--warmup", "1", "--iters", "2",
					"--rendezvous", rv, "--out", out, "--format", "json", "--comm-timeout", commTimeout(t), "--ncclep-timeout", commTimeout(t)}, shape...)...)
			rec := runRecord(t, out, ps)
			for r, p := range ps {
				if strings.Contains(p.stderr.String(), "NCCL EP: ") { // the fake's complaint: a broken contract, even in the teardown
					t.Errorf("process %d: the fake NCCL EP refused a call:\n%s", r, p.stderr.String())
				}
			}
			if g := rec.Correctness.Grads; c.pass == "" {
				if rec.Config.Pass != results.PassTraining || rec.Config.PassNote != "" || g == nil || len(g.PerTensor) < 5 || !(g.MaxRelErr <= g.Tolerance) ||
					rec.Traffic == nil || rec.Traffic.DispatchBackwardLogical != rec.Traffic.DispatchLogical {
					t.Errorf("pass %q (%s); gradients %+v; traffic %+v", rec.Config.Pass, rec.Config.PassNote, g, rec.Traffic)
				}
			} else if rec.Config.Pass != results.PassForward || !strings.Contains(rec.Config.PassNote, c.pass) || g != nil {
				t.Errorf("pass %q (%s)", rec.Config.Pass, rec.Config.PassNote)
			}
			if lib := rec.Library; lib == nil || !strings.HasPrefix(lib.Design, c.design) || !strings.Contains(lib.Detail, "over 2 processes (2 each)") ||
				!strings.Contains(rec.Ranks.Note, "through NCCL EP 0.1.0") {
				t.Errorf("library %+v; ranks %q", lib, rec.Ranks.Note)
			}
			if len(rec.Ranks.Processes) != 2 || len(rec.Ranks.Devices) != 4 || rec.Ranks.Processes[1].Host != "node-1" {
				t.Fatalf("ranks %+v", rec.Ranks)
			}
			for _, ph := range rec.Timing.Phases {
				for r, v := range ph.PerRank {
					if !(v > 0) {
						t.Errorf("%s: rank %d's time %v", ph.Name, r, v)
					}
				}
			}
			tr := rec.Traffic
			if tr == nil || tr.DispatchOffRank == 0 || tr.DispatchLogical < tr.DispatchOffRank || tr.InterNodeBytes == 0 || tr.IntraNodeBytes == 0 ||
				!(tr.DispatchInterNodeGBps > 0) || !strings.Contains(tr.Formula, "NCCL EP") {
				t.Fatalf("traffic %+v", tr)
			}
			// every rank's copies counted, the other process's included:
			// 4 ranks × 16 tokens × top-k
			if row := int64(2*128 + map[string]int64{"hybridep": 4, "deepep-ll": 0}[c.dispatcher]); tr.DispatchLogical != 4*16*int64(rec.Config.TopK)*row {
				t.Errorf("dispatch logical %d bytes: want every rank's %d copies of %d B", tr.DispatchLogical, 4*16*rec.Config.TopK, row)
			}
			t.Logf("%s; max rel err %.2e; inter-node %d B, intra-node %d B", rec.Ranks.Note, rec.Correctness.MaxRelErr, tr.InterNodeBytes, tr.IntraNodeBytes)
		})
	}
	t.Run("gpu-check", gpuCheckNCCLEP)
	t.Run("killed", func(t *testing.T) {
		killedProcessOf(t, rv, out, append([]string{"--dispatcher", "hybridep", "--impl", "library"}, shape...)...)
	})
}

// gpuCheckNCCLEP: scripts/gpu-check.sh's run over two processes on a node
// of two (fake) GPUs where doctor finds NCCL EP (the fake): alltoall
// through NCCL, hybridep natively (a domain a process), then hybridep and
// deepep-ll through NCCL EP, each at EP 2 over two processes, each passing
// with one record appended by rank 0.
func gpuCheckNCCLEP(t *testing.T) {
	out, b := gpuCheckTwoproc(t, "--hidden 128")
	for _, name := range []string{"twoproc-alltoall-nccl-ep2", "twoproc-hybridep-ep2-d1", "twoproc-ncclep-ht-ep2", "twoproc-ncclep-ll-ep2"} {
		if !strings.Contains(string(b), name+" ") {
			t.Errorf("no %s in the output:\n%s", name, b)
		}
	}
	recs, err := results.ReadFile(filepath.Join(out, "records.jsonl"), nil)
	if err != nil || len(recs) != 4 {
		t.Fatalf("%d records, %v; output:\n%s", len(recs), err, b)
	}
	for i, d := range []string{"alltoall", "hybridep", "hybridep", "deepep-ll"} {
		if rec := recs[i]; rec.Config.Dispatcher != d || rec.Status != results.StatusOK || len(rec.Ranks.Processes) != 2 {
			t.Errorf("record %d: %s %s: %s", i, rec.Config.Dispatcher, rec.Status, rec.Reason)
		}
	}
}

// TestDistributedHybridEP: hybridep's native implementation at EP 4 over 2
// processes with --domain 2, each process one NVLink domain of two fake
// GPUs on a node of its own: inside a domain the kernels store into the
// peer GPU's memory, between the domains the routing map's rows and the
// inter-domain path (the rows and probabilities out, the pre-reduced sums
// back; the gradients the same way in the backward) go over the run's
// NCCL communicator (the fake's loopback send/recv). Every process exits 0
// and rank 0 alone writes one record: the training step, whose outputs and
// gradients pass the float64 check (each process its own ranks'), with
// inter-node bytes counted and NCCL named as what moves data between the
// domains. With --domain 1 each process holds two domains: the
// inter-domain path runs both inside a process and between them. EP 8
// over 4 processes with --domain 2: four domains, each rank's map rows and
// inter-domain rows going to three other processes.
//
// domain-over-processes (a subtest): --domain 4 and --domain 0 put one
// domain over both processes: refused on both, naming the flag, its value
// and the ranks each process drives, before they meet in NCCL.
//
// wrong-slot-on-process-1: process 1's kernels pack each row for the other
// domain at its neighbour's slot (MOEBENCH_TEST_MUTATE): the run fails the
// check and rank 0 records it.
//
// killed: a process killed during the steps makes the other exit naming
// it within --comm-timeout.
func TestDistributedHybridEP(t *testing.T) {
	hostsim.SkipIfShort(t, "TestDistributedCommIDUnarrived (processes meeting in NCCL) and the harness's TestCUDALayerOnHostSim (the layer on the fake GPUs)")
	rv, out := distributedSetup(t)
	flagsEP := func(ep int, more ...string) []string {
		return append([]string{"--device", "cuda", "--dispatcher", "hybridep", "--ep", fmt.Sprint(ep), "--experts", "16", "--tokens", "16", "--hidden", "32",
			"--ffn", "16", "--sms", "2", "--warmup", "1", "--iters", "2", "--rendezvous", rv, "--out", out, "--format", "json", "--comm-timeout", commTimeout(t)}, more...)
	}
	flags := func(more ...string) []string { return flagsEP(4, more...) }
	nodes := func(r int) []string { return []string{fmt.Sprintf("MOEBENCH_NODE=node-%d", r)} }
	for _, c := range []struct{ ep, world, domain int }{{4, 2, 2}, {4, 2, 1}, {8, 4, 2}} {
		t.Run(fmt.Sprintf("ep%d-over-%d-domain-%d", c.ep, c.world, c.domain), func(t *testing.T) {
			os.Remove(out)
			hybridepAcross(t, out, c.ep, launchProcsEnv(t, c.world, nodes, flagsEP(c.ep, "--domain", fmt.Sprint(c.domain))...))
		})
	}
	t.Run("domain-over-processes", func(t *testing.T) {
		for _, c := range []struct{ domain, says string }{
			{"4", "--domain 4 puts a domain over several of the 2 processes, which drive 2 ranks each (--ep 4)"},
			{"0", "--domain 0 (one domain of all 4 ranks) puts a domain over several of the 2 processes, which drive 2 ranks each (--ep 4)"},
		} {
			os.Remove(out)
			ps := launchProcs(t, 2, flags("--domain", c.domain)...)
			for r, p := range ps {
				err := p.wait(t, time.Minute)
				msg := p.stdout.String() + p.stderr.String()
				if err == nil || !strings.Contains(msg, c.says) || !strings.Contains(msg, "a --domain that divides 2 runs") {
					t.Errorf("--domain %s, process %d: %v; output:\n%s", c.domain, r, err, msg)
				}
				if strings.Contains(p.stderr.String(), "ncclCommInitRank") {
					t.Errorf("process %d met in NCCL for a run it refuses:\n%s", r, p.stderr.String())
				}
			}
			if recs, _ := results.ReadFile(out, nil); len(recs) > 1 || len(recs) == 1 && recs[0].Status != results.StatusUnavailable {
				t.Errorf("--domain %s: %d records; %+v", c.domain, len(recs), recs)
			}
		}
	})
	t.Run("wrong-slot-on-process-1", func(t *testing.T) {
		os.Remove(out)
		ps := launchProcsEnv(t, 2, func(r int) []string {
			if r == 1 {
				return []string{"MOEBENCH_TEST_MUTATE=hybridep_pack_slot"}
			}
			return nil
		}, flags("--domain", "2")...)
		for r, p := range ps {
			if err := p.wait(t, 4*time.Minute); err == nil {
				t.Errorf("process %d exited 0; stderr:\n%s", r, p.stderr.String())
			}
		}
		if !strings.Contains(ps[1].stderr.String(), "moebench test: planted a bug in hybridep_pack_slot") {
			t.Fatalf("process 1 ran no planted bug; stderr:\n%s", ps[1].stderr.String())
		}
		recs, err := results.ReadFile(out, nil)
		if err != nil || len(recs) != 1 {
			t.Fatalf("%d records, %v; process 0's stderr:\n%s", len(recs), err, ps[0].stderr.String())
		}
		if c := recs[0].Correctness; recs[0].Status != results.StatusFailed || c == nil || c.Passed || recs[0].Timing != nil ||
			!strings.Contains(recs[0].Reason, "process 1: max relative error") {
			t.Fatalf("record: %s: %s; correctness %+v", recs[0].Status, recs[0].Reason, c)
		}
		t.Logf("rank 0's record: %s", recs[0].Reason)
	})
	t.Run("killed", func(t *testing.T) {
		killedProcessOf(t, rv, out, "--dispatcher", "hybridep", "--domain", "2", "--sms", "2")
	})
}

// hybridepAcross waits for ps, hybridep's processes at EP ep (each on a
// node of its own), and checks the run's one record: the training step
// passed, every phase timed on every rank, the bytes between nodes and
// between domains counted, NCCL named.
func hybridepAcross(t *testing.T, out string, ep int, ps []*proc) {
	rec := runRecord(t, out, ps)
	c := rec.Correctness
	if rec.Config.Pass != results.PassTraining || rec.Timing.Backward == nil || !(rec.Timing.Backward.P50 > 0) {
		t.Fatalf("pass %q (%q), backward %+v", rec.Config.Pass, rec.Config.PassNote, rec.Timing.Backward)
	}
	g := c.Grads
	if g == nil || !(g.MaxRelErr <= g.Tolerance) || len(g.PerTensor) == 0 || !strings.Contains(g.Note, "each process compares its own ranks'") {
		t.Fatalf("gradient check %+v", g)
	}
	for n, e := range g.PerTensor {
		if !(e > 0 && e <= g.Tolerance) { // 0 would be a gradient compared with nothing
			t.Errorf("gradient %s: error %g", n, e)
		}
	}
	if len(rec.Ranks.Processes) != len(ps) || len(rec.Ranks.Devices) != ep || rec.Ranks.Processes[1].Host != "node-1" ||
		!strings.Contains(rec.Ranks.Note, "NCCL") {
		t.Fatalf("ranks %+v", rec.Ranks)
	}
	// every rank's buffers as its own process sized them (the expert-major
	// rows each step's preprocessing sizes among them)
	if rec.Memory == nil || len(rec.Memory.Buffers) == 0 {
		t.Fatalf("memory %+v", rec.Memory)
	}
	for _, b := range rec.Memory.Buffers {
		if len(b.PerRankBytes) != ep || slices.Contains(b.PerRankBytes, 0) {
			t.Errorf("buffer %s: %v bytes per rank", b.Name, b.PerRankBytes)
		}
	}
	names := map[string]bool{}
	for _, ph := range rec.Timing.Phases {
		names[ph.Name] = true
		for r, v := range ph.PerRank {
			if !(v > 0) {
				t.Errorf("%s: rank %d's time %v", ph.Name, r, v)
			}
		}
	}
	for _, ph := range []string{"allgather", "preprocess", "dispatch", "combine", "combine-bwd", "dispatch-bwd"} {
		if !names[ph] {
			t.Errorf("no phase %s among %v", ph, names)
		}
	}
	tr := rec.Traffic
	if tr == nil || tr.DispatchOffRank == 0 || tr.InterNodeBytes == 0 || tr.IntraNodeBytes == 0 || !(tr.DispatchInterNodeGBps > 0) ||
		tr.DispatchInterDomain == 0 || !strings.Contains(tr.Formula, "inter-domain path moved by NCCL") || !strings.Contains(tr.Formula, "the run spans processes") {
		t.Fatalf("traffic %+v", tr)
	}
	t.Logf("%s; max rel err %.2e, gradients %.2e; inter-node %d B, intra-node %d B, inter-domain %d B", rec.Ranks.Note, c.MaxRelErr, g.MaxRelErr,
		tr.InterNodeBytes, tr.IntraNodeBytes, tr.DispatchInterDomain)
}

// exitCode is err's exit status (0: none; -1: not an exit).
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	return -1
}

// TestDistributedRendezvous: what --rendezvous FILE does with the files
// around it and with processes that do not belong together.
//
// existing-results-file: --rendezvous naming a file that is not a
// rendezvous file of moebench's (a results file) is refused on every
// process, exit 2, saying what the file is; the file is intact.
//
// nothing-left: a successful run leaves nothing beside FILE (no id, tag,
// hello, agreement or status file), FILE included.
//
// differ/*: processes launched with different settings (the seed with the
// check off, the iterations, the tokens, the dispatcher, the world size)
// are refused on every process with exit 2 before they build the layer,
// naming each differing flag with each process's value; no record.
//
// differ-over-nccl: with NCCL_COMM_ID alone (no files to meet through)
// the settings are compared over NCCL once the processes met there: a
// different seed is refused the same way.
//
// never-started: process 1 of 2 never starts: process 0 exits within
// --rendezvous-timeout, naming it; meanwhile its progress line says whom
// it waits for.
//
// rank-without-world: MOEBENCH_RANK without MOEBENCH_WORLD is refused
// (exit 2), naming both, not run as one process.
func TestDistributedRendezvous(t *testing.T) {
	_, out := distributedSetup(t)
	small := []string{"--device", "cuda", "--dispatcher", "alltoall", "--impl", "library", "--ep", "4",
		"--experts", "16", "--tokens", "16", "--hidden", "32", "--ffn", "16", "--warmup", "1", "--iters", "2", "--comm-timeout", commTimeout(t)}
	args := func(rv string, more ...string) []string {
		return append(append(slices.Clone(small), "--rendezvous", rv, "--out", out, "--format", "json"), more...)
	}
	t.Run("existing-results-file", func(t *testing.T) {
		os.Remove(out)
		old := filepath.Join(t.TempDir(), "old.jsonl") // a results file of an earlier run
		if _, err := results.Append(old, &results.Record{Schema: results.Schema, Status: results.StatusOK}); err != nil {
			t.Fatal(err)
		}
		before, _ := os.ReadFile(old)
		ps := launchProcs(t, 2, args(old)...)
		for r, p := range ps {
			err := p.wait(t, 2*time.Minute)
			if msg := p.stderr.String(); exitCode(err) != 2 || !strings.Contains(msg, "--rendezvous="+old+": ") || !strings.Contains(msg, "is not a rendezvous file") ||
				!strings.Contains(msg, "a moebench results file (JSON lines") {
				t.Errorf("process %d: %v; stderr:\n%s", r, err, msg)
			}
		}
		if b, err := os.ReadFile(old); err != nil || len(before) == 0 || string(b) != string(before) {
			t.Errorf("%s after the run: %q, %v (before: %q)", old, b, err, before)
		}
		if left, _ := filepath.Glob(old + ".*"); len(left) > 0 {
			t.Errorf("left beside %s: %v", old, left)
		}
		if _, err := os.Stat(out); err == nil {
			t.Error("a record was written")
		}
	})
	t.Run("nothing-left", func(t *testing.T) {
		hostsim.SkipIfShort(t, "TestDistributedRendezvous/existing-results-file, differ/seed and rank-without-world")
		os.Remove(out)
		dir := t.TempDir()
		ps := launchProcs(t, 2, args(filepath.Join(dir, "rv"))...)
		runRecord(t, out, ps)
		if left, _ := os.ReadDir(dir); len(left) > 0 {
			var names []string
			for _, e := range left {
				names = append(names, e.Name())
			}
			t.Errorf("a successful run left %v in the rendezvous folder", names)
		}
	})
	for _, c := range []struct {
		name  string
		one   []string // process 1's flags (process 0 runs the defaults)
		world string   // process 1's MOEBENCH_WORLD, when not 2
		want  []string
	}{
		{name: "seed", one: []string{"--seed", "7", "--check=false"}, want: []string{"--seed differs: process 0 has 1, process 1 has 7", "--check differs: process 0 has sample, process 1 has off"}},
		{name: "iters", one: []string{"--iters", "3"}, want: []string{"--iters differs: process 0 has 2, process 1 has 3"}},
		{name: "tokens", one: []string{"--tokens", "32"}, want: []string{"--tokens differs: process 0 has 16, process 1 has 32"}},
		{name: "dispatcher", one: []string{"--dispatcher", "hybridep", "--impl", "native", "--domain", "2", "--sms", "2"},
			want: []string{"--dispatcher differs: process 0 has alltoall, process 1 has hybridep", "--impl differs: process 0 has library, process 1 has native",
				"--domain differs: process 0 has 0, process 1 has 2", "--sms differs: process 0 has 0, process 1 has 2"}},
		{name: "world", world: "4", want: []string{"MOEBENCH_WORLD differs: process 0 has 2, process 1 has 4"}},
	} {
		t.Run("differ/"+c.name, func(t *testing.T) {
			if c.name != "seed" {
				hostsim.SkipIfShort(t, "TestDistributedRendezvous/existing-results-file, differ/seed and rank-without-world")
			}
			os.Remove(out)
			rv := filepath.Join(t.TempDir(), "rv")
			start := time.Now()
			ps := launchProcsEnv(t, 2, func(r int) []string {
				if r == 0 {
					return nil
				}
				env := []string{"MOEBENCH_TEST_ARGS=" + strings.Join(c.one, " ")}
				if c.world != "" {
					env = append(env, "MOEBENCH_WORLD="+c.world)
				}
				return env
			}, args(rv)...)
			for r, p := range ps {
				err := p.wait(t, time.Minute)
				msg := p.stderr.String()
				if exitCode(err) != 2 || strings.Contains(msg, "ncclCommInitRank") {
					t.Errorf("process %d: %v after %v; stderr:\n%s", r, err, time.Since(start), msg)
				}
				for _, w := range c.want {
					if !strings.Contains(msg, w) {
						t.Errorf("process %d's stderr lacks %q:\n%s", r, w, msg)
					}
				}
			}
			if _, err := os.Stat(out); err == nil {
				t.Error("a record was written for processes that disagree")
			}
			t.Logf("after %v: %s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(ps[0].stderr.String()))
		})
	}
	t.Run("differ/sweep", func(t *testing.T) { // a sweep refuses the same way, exit 2, before its first point
		hostsim.SkipIfShort(t, "TestDistributedRendezvous/existing-results-file, differ/seed and rank-without-world")
		os.Remove(out)
		rv := filepath.Join(t.TempDir(), "rv")
		sweep := append([]string{"sweep"}, slices.Clone(small)...)
		ps := launchProcsEnv(t, 2, func(r int) []string {
			if r == 0 {
				return nil
			}
			return []string{"MOEBENCH_TEST_ARGS=--seed 7"}
		}, append(sweep, "--rendezvous", rv, "--out", out)...)
		for r, p := range ps {
			err := p.wait(t, time.Minute)
			if msg := p.stderr.String(); exitCode(err) != 2 || !strings.Contains(msg, "--seed differs: process 0 has 1, process 1 has 7") {
				t.Errorf("process %d: %v; stderr:\n%s", r, err, msg)
			}
		}
		if _, err := os.Stat(out); err == nil {
			t.Error("a record was written for processes that disagree")
		}
	})
	t.Run("differ-over-nccl", func(t *testing.T) { // NCCL_COMM_ID alone: compared over the communicator
		hostsim.SkipIfShort(t, "TestDistributedRendezvous/existing-results-file, differ/seed and rank-without-world")
		os.Remove(out)
		l, err := net.Listen("tcp", "127.0.0.1:0") // a free port for NCCL's bootstrap root
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		ps := launchProcsEnv(t, 2, func(r int) []string {
			env := []string{fmt.Sprintf("NCCL_COMM_ID=127.0.0.1:%d", port)}
			if r == 1 {
				env = append(env, "MOEBENCH_TEST_ARGS=--seed 7 --check=false")
			}
			return env
		}, append(slices.Clone(small), "--out", out)...)
		for r, p := range ps {
			err := p.wait(t, 2*time.Minute)
			msg := p.stderr.String()
			if exitCode(err) != 2 || !strings.Contains(msg, "--seed differs: process 0 has 1, process 1 has 7") ||
				!strings.Contains(msg, "--check differs: process 0 has sample, process 1 has off") {
				t.Errorf("process %d: %v; stderr:\n%s", r, err, msg)
			}
		}
		if _, err := os.Stat(out); err == nil {
			t.Error("a record was written for processes that disagree")
		}
		t.Logf("%s", ps[0].stderr.String())
	})
	t.Run("never-started", func(t *testing.T) {
		hostsim.SkipIfShort(t, "TestDistributedRendezvous/existing-results-file, differ/seed and rank-without-world")
		os.Remove(out)
		rv := filepath.Join(t.TempDir(), "rv")
		start := time.Now()
		p := launchProcsEnv(t, 1, func(int) []string { return []string{"MOEBENCH_WORLD=2"} }, args(rv, "--rendezvous-timeout", "12s")...)[0]
		err := p.wait(t, time.Minute)
		took, msg := time.Since(start), p.stderr.String()
		if exitCode(err) != 1 || took > 30*time.Second || !strings.Contains(msg, "process 1 of 2") || !strings.Contains(msg, "--rendezvous-timeout") ||
			!strings.Contains(msg, "waiting for process 1 of 2") {
			t.Errorf("%v after %v; stderr:\n%s", err, took, msg)
		}
		t.Logf("after %v: %s", took.Round(time.Millisecond), msg)
	})
	t.Run("rank-without-world", func(t *testing.T) {
		os.Remove(out)
		cmd := exec.Command(os.Args[0], append(slices.Clone(small), "--out", out)...)
		cmd.Env = append(os.Environ(), "MOEBENCH_TEST_PROCESS=1", "MOEBENCH_RANK=1", "FAKENCCL_TIMEOUT_S=120")
		b, err := cmd.CombinedOutput()
		if exitCode(err) != 2 || !strings.Contains(string(b), "MOEBENCH_RANK=1 without MOEBENCH_WORLD") {
			t.Errorf("%v; output:\n%s", err, b)
		}
		if _, err := os.Stat(out); err == nil {
			t.Error("a record was written")
		}
	})
}

// TestSettingFlags: every setting the processes of a run compare is named
// by a flag of the run's command line.
func TestSettingFlags(t *testing.T) {
	fs := newFlags(&options{})
	for _, f := range setup.SettingFlags() {
		if fs.Lookup(f) == nil {
			t.Errorf("--%s: not a flag of moebench run", f)
		}
	}
}

// TestDistributedRendezvousIsOut: --rendezvous naming the --out file (a
// new one: the rendezvous would write it, and remove it with the record
// at the end) is a usage error on every process, before anything runs or
// is written.
func TestDistributedRendezvousIsOut(t *testing.T) {
	t.Setenv("MOEBENCH_RANK", "1")
	t.Setenv("MOEBENCH_WORLD", "2")
	dir := t.TempDir()
	out := filepath.Join(dir, "runs.jsonl")
	code, _, e := cli("--device", "cuda", "--dispatcher", "alltoall", "--impl", "library", "--ep", "4",
		"--rendezvous", out, "--rendezvous-timeout", "1s", "--out", dir+"/x/../runs.jsonl", "--check=false")
	if code != exitUsage || !strings.Contains(e, "--rendezvous="+out+": is the --out file") {
		t.Errorf("exit %d; stderr %q", code, e)
	}
	if left, _ := os.ReadDir(dir); len(left) > 0 {
		t.Errorf("left %v", left)
	}
}
