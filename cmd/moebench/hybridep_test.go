package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/moebench/moebench/results"
)

// TestHybridEPRun: 'moebench --dispatcher hybridep --sms 32' runs on the
// host device with PASS, its own phases, bandwidth per SM and its
// worst-case buffers; --sms 0 is Megatron's 16; with --domain smaller than
// EP the inter-domain bytes and buffer show; a --domain that does not
// divide EP is a usage error naming the flag.
func TestHybridEPRun(t *testing.T) {
	out := filepath.Join(t.TempDir(), "r.jsonl")
	code, stdout, stderr := cli(append(quick, "--wide", "--dispatcher", "hybridep", "--sms", "32", "--out", out)...)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"correctness            PASS", "\n  allgather ", "\n  preprocess ", "\n  dispatch ", "\n  experts ", "\n  combine ",
		"GB/s per SM (32 SMs)", "dispatcher buffers     receive "} {
		if !strings.Contains(stdout, want) {
			t.Errorf("missing %q in\n%s", want, stdout)
		}
	}
	for _, not := range []string{"\n  permute ", "\n  unpermute ", "inter-domain"} {
		if strings.Contains(stdout, not) {
			t.Errorf("%q in a one-domain run:\n%s", not, stdout)
		}
	}
	code, stdout, stderr = cli(append(quick, "--dispatcher", "hybridep", "--domain", "2", "--out", out)...)
	if code != exitOK {
		t.Fatalf("--domain 2: exit %d: %s", code, stderr)
	}
	for _, want := range []string{"sms default · domain 2 ·", "inter-domain", "dispatcher buffers     receive "} {
		if !strings.Contains(stdout, want) {
			t.Errorf("--domain 2: missing %q in\n%s", want, stdout)
		}
	}
	recs, err := results.ReadFile(out, nil)
	if err != nil || len(recs) != 2 {
		t.Fatal(recs, err)
	}
	one, two := recs[0], recs[1]
	if one.SMs.Configured != 32 || one.SMs.Budget != 32 || two.SMs.Configured != 0 || two.SMs.Budget != 16 ||
		one.Traffic.DispatchGBpsPerSM != one.Traffic.DispatchGBps/32 {
		t.Errorf("budgets: %+v, %+v; traffic %+v", one.SMs, two.SMs, one.Traffic)
	}
	// the receive buffer by hand: tokens 16 × ranks 4 × hidden 32 × 2 B,
	// whatever the domain; the inter-domain one with --domain 2: tokens 16
	// × one other domain × (64 B row + 4 experts × 2 ranks × 4 B)
	bufs := map[string]int64{}
	for _, b := range two.Memory.Buffers {
		bufs[b.Name] = b.PerRankBytes[0]
	}
	if one.Memory.Buffers[0].Name != "receive" || one.Memory.Buffers[0].PerRankBytes[0] != 16*4*64 || bufs["receive"] != 16*4*64 ||
		bufs["inter-domain"] != 16*(64+32) || two.Traffic.DispatchInterDomain == 0 || two.Config.Domain != 2 {
		t.Errorf("buffers %+v, %v; traffic %+v", one.Memory.Buffers, bufs, two.Traffic)
	}
	if code, _, e := cli(append(quick, "--dispatcher", "hybridep", "--domain", "3")...); code != exitUsage || !strings.Contains(e, "--domain=3") {
		t.Errorf("--domain 3: exit %d, %q", code, e)
	}
}

// TestSweepThreeDesigns: a sweep over alltoall, deepep and hybridep at
// three budgets gives one table with the three designs side by side: one
// alltoall row and three rows each of deepep and hybridep, all ok.
func TestSweepThreeDesigns(t *testing.T) {
	out := filepath.Join(t.TempDir(), "s.jsonl")
	code, _, stderr := cli(append([]string{"sweep", "--out", out, "--dispatchers", "alltoall,deepep,hybridep", "--sms", "16,24,32", "--ep", "4"}, sweepQuick...)...)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	code, report, _ := cli("report", out)
	rows, headers := map[string]int{}, 0
	for _, l := range strings.Split(report, "\n") {
		if strings.HasPrefix(l, "# dispatcher") {
			headers++
		}
		if f := strings.Fields(l); len(f) > 3 && f[3] == "ok" {
			rows[f[0]]++
		}
	}
	if code != exitOK || headers != 1 || rows["alltoall"] != 1 || rows["deepep"] != 3 || rows["hybridep"] != 3 {
		t.Errorf("report: exit %d, %d tables, ok rows %v:\n%s", code, headers, rows, report)
	}
}

// TestBenchDispatchHybridEP: 'bench dispatch' times hybridep at each budget,
// across domains too, each point checked by the exact round trip.
func TestBenchDispatchHybridEP(t *testing.T) {
	code, stdout, stderr := cli("bench", "dispatch", "--dispatcher", "hybridep", "--sms", "16,32", "--ep", "4", "--domain", "2",
		"--tokens", "16", "--hidden", "32", "--warmup", "0", "--iters", "2")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	rows := 0
	for _, l := range strings.Split(stdout, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "hybridep ") && strings.Contains(l, "round trip exact") {
			rows++
		}
	}
	if rows != 2 {
		t.Errorf("%d checked hybridep rows, want 2:\n%s", rows, stdout)
	}
}
