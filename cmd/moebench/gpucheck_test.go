package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBuildGPUBins: scripts/build-gpu-bins.sh, with a stand-in go that
// writes a file of FAKE_GO_BYTES where -o names it, builds every binary
// stripped (-ldflags=-s -w), says each file's size and the total, and fails
// (exit 1, naming the limit) above MAX_MIB (48 MiB unless set); quick builds
// what gpu-check.sh quick runs alone; a MAX_MIB that is no number or an
// unknown argument is a usage error.
func TestBuildGPUBins(t *testing.T) {
	dir := t.TempDir()
	fakeGo := filepath.Join(dir, "path", "go")
	os.MkdirAll(filepath.Dir(fakeGo), 0o755)
	os.WriteFile(fakeGo, []byte(`#!/bin/sh
echo "$*" >> "$FAKE_GO_LOG"
while [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done
head -c "$FAKE_GO_BYTES" /dev/zero > "$out"
`), 0o755)
	const mib = 1 << 20
	build := func(t *testing.T, bytes int, maxMiB string, args ...string) (code int, out, log string, bins []string) {
		t.Helper()
		bin, goLog := t.TempDir(), filepath.Join(t.TempDir(), "go.log")
		os.WriteFile(filepath.Join(bin, "stale.test"), []byte("an old package's"), 0o755)
		cmd := exec.Command("bash", append([]string{"../../scripts/build-gpu-bins.sh"}, args...)...)
		cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(fakeGo)+":"+os.Getenv("PATH"), "BIN_DIR="+bin, "FAKE_GO_LOG="+goLog,
			fmt.Sprintf("FAKE_GO_BYTES=%d", bytes), "MAX_MIB="+maxMiB)
		b, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		l, _ := os.ReadFile(goLog)
		ents, _ := os.ReadDir(bin)
		for _, e := range ents {
			bins = append(bins, e.Name())
		}
		return code, string(b), string(l), bins
	}
	all := []string{"dispatchers_deepep.test", "dispatchers_hybridep.test", "harness.test", "internal_cuda.test", "kernels.test", "moebench"}
	t.Run("within", func(t *testing.T) {
		code, out, log, bins := build(t, mib, "")
		if code != 0 || strings.Join(bins, " ") != strings.Join(all, " ") {
			t.Fatalf("exit %d, built %v:\n%s", code, bins, out)
		}
		for _, name := range all {
			if !strings.Contains(out, fmt.Sprintf("%10d B     1.0 MiB  ", mib)) || !strings.Contains(out, "/"+name+"\n") {
				t.Errorf("no size of %s:\n%s", name, out)
			}
		}
		if !strings.Contains(out, fmt.Sprintf("%10d B     6.0 MiB  ", 6*mib)) || !strings.Contains(out, "in all (limit 48 MiB)") {
			t.Errorf("no total:\n%s", out)
		}
		lines := strings.Split(strings.TrimSpace(log), "\n")
		if len(lines) != len(all) {
			t.Fatalf("go ran %d times:\n%s", len(lines), log)
		}
		for _, l := range lines {
			if !strings.Contains(l, "-ldflags=-s -w ") {
				t.Errorf("not stripped: go %s", l)
			}
		}
	})
	t.Run("above", func(t *testing.T) {
		code, out, _, _ := build(t, 9*mib, "") // 54 MiB
		if code != 1 || !strings.Contains(out, fmt.Sprintf("holds %d B of binaries, above the limit of MAX_MIB=48 MiB", 54*mib)) {
			t.Errorf("exit %d:\n%s", code, out)
		}
		if code, out, _, _ := build(t, 9*mib, "60"); code != 0 || !strings.Contains(out, "in all (limit 60 MiB)") {
			t.Errorf("MAX_MIB=60: exit %d:\n%s", code, out)
		}
	})
	t.Run("quick", func(t *testing.T) {
		code, out, _, bins := build(t, mib, "", "quick")
		if want := "dispatchers_deepep.test dispatchers_hybridep.test kernels.test moebench"; code != 0 || strings.Join(bins, " ") != want {
			t.Errorf("exit %d, built %v, want %s:\n%s", code, bins, want, out)
		}
	})
	t.Run("usage", func(t *testing.T) {
		if code, out, _, _ := build(t, mib, "lots"); code != 2 || !strings.Contains(out, "MAX_MIB=lots: must be a whole number of MiB") {
			t.Errorf("exit %d:\n%s", code, out)
		}
		if code, out, _, _ := build(t, mib, "", "all"); code != 2 || !strings.Contains(out, "unknown argument 'all' (known: quick)") {
			t.Errorf("exit %d:\n%s", code, out)
		}
	})
}
