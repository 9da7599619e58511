package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moebench/moebench/results"
)

// TestOutputsCheckedFirst: an --out or --dump that would fail, or destroy a
// file, is refused before the layer runs (exit 2, nothing printed, every
// file as it was).
func TestOutputsCheckedFirst(t *testing.T) {
	dir := t.TempDir()
	code, _, errOut := cli(append(quick, "--out", filepath.Join(dir, "good.jsonl"))...)
	if code != exitOK {
		t.Fatalf("making a results file: exit %d: %s", code, errOut)
	}
	good, _ := os.ReadFile(filepath.Join(dir, "good.jsonl"))
	file := func(name string, body []byte) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, body, 0o644)
		return p
	}
	plain := file("notes.txt", []byte("my notes\n"))
	link := filepath.Join(dir, "link")
	os.Symlink(plain, link)
	other := file("other.jsonl", append(append([]byte{}, good...), strings.Replace(string(good), results.Schema, "other.record/v2", 1)...))
	results := file("results.jsonl", good)
	fresh := filepath.Join(dir, "fresh")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--dump", plain}, "--dump=" + plain + ": exists and is not a directory"},
		{[]string{"--dump", link}, "--dump=" + link + ": is a symbolic link"},
		{[]string{"--dump", filepath.Join(dir, "missing", "sub")}, "--dump=" + filepath.Join(dir, "missing", "sub") + ": cannot create it"},
		{[]string{"--out", fresh, "--dump", fresh}, "--dump=" + fresh + ": the --out file (" + fresh + ") would be inside the dump's directory"},
		{[]string{"--out", results, "--dump", results}, "--dump=" + results + ": exists and is not a directory"},
		{[]string{"--out", other}, "--out=" + other + ": " + other + ":2: not a moebench record (schema \"other.record/v2\""},
		{[]string{"--out", plain}, "--out=" + plain + ": " + plain + ":1: not a moebench record (not a JSON object"},
		{[]string{"--out", filepath.Join(plain, "x.jsonl")}, "not a directory"},
		{[]string{"--out", "/sys/moebench-test.jsonl"}, "--out=/sys/moebench-test.jsonl: cannot create it"},
		{[]string{"--out", dir}, "is a directory"},
	} {
		for _, cmd := range [][]string{nil, {"sweep"}} {
			if cmd != nil && slices.Contains(c.args, "--dump") {
				continue // sweep has no --dump
			}
			args := append(append(append([]string{}, cmd...), quick...), c.args...)
			code, out, errOut := cli(args...)
			if code != exitUsage || !strings.Contains(errOut, c.want) || out != "" {
				t.Errorf("%v: exit %d, stdout %d bytes, stderr %q; want exit 2 and %q", args, code, len(out), errOut, c.want)
			}
		}
	}
	for p, body := range map[string][]byte{plain: []byte("my notes\n"), results: good} {
		if b, _ := os.ReadFile(p); !bytes.Equal(b, body) {
			t.Errorf("%s changed", p)
		}
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("the symlink is gone: %v", err)
	}
	if _, err := os.Stat(fresh); !os.IsNotExist(err) {
		t.Errorf("%s was created: %v", fresh, err)
	}
}

// TestOutHealsTornTail: a results file that a killed run left with an
// unfinished record is appended to: the run says so, drops only the
// unfinished bytes, and every whole record stays.
func TestOutHealsTornTail(t *testing.T) {
	p := filepath.Join(t.TempDir(), "r.jsonl")
	if code, _, errOut := cli(append(quick, "--out", p)...); code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	good, _ := os.ReadFile(p)
	os.WriteFile(p, append(append([]byte{}, good...), good[:100]...), 0o644)
	code, _, errOut := cli("report", p)
	if code != exitOK || !strings.Contains(errOut, "r.jsonl:2: skipped an unfinished record at the end (100 bytes") {
		t.Errorf("report of a torn file: exit %d, %q", code, errOut)
	}
	for _, args := range [][]string{append(quick, "--out", p), append(append([]string{"sweep"}, quick...), "--out", p)} {
		os.WriteFile(p, append(append([]byte{}, good...), good[:100]...), 0o644)
		code, _, errOut = cli(args...)
		if code != exitOK || !strings.Contains(errOut, "ends in an unfinished record (100 bytes") ||
			!strings.Contains(errOut, "dropped the 100 bytes of an unfinished record") {
			t.Errorf("%v: exit %d, %q", args, code, errOut)
		}
		recs, err := results.ReadFile(p, nil)
		if err != nil || len(recs) != 2 {
			t.Errorf("%v: %d records after the append: %v", args, len(recs), err)
		}
	}
}
