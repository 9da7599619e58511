package results

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func line(t *testing.T, r *Record) []byte {
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return append(b, '\n')
}

// collect gathers Read's warnings.
func collect(w *[]string) func(string) { return func(s string) { *w = append(*w, s) } }

// TestAppendHealsTornTail: a file ending in an unfinished record (a writer
// killed mid-write) is read without it, with a warning, and the next append
// cuts it off, says how much it dropped, and keeps every whole record.
func TestAppendHealsTornTail(t *testing.T) {
	whole := line(t, sample(StatusOK))
	for _, cut := range []int{1, 5, len(recordStart) + 3, len(whole) / 2, len(whole) - 2} {
		t.Run(fmt.Sprintf("cut%d", cut), func(t *testing.T) {
			t.Parallel()
			p := filepath.Join(t.TempDir(), "r.jsonl")
			os.WriteFile(p, append(append([]byte{}, whole...), whole[:cut]...), 0o644)
			var warns []string
			recs, err := ReadFile(p, collect(&warns))
			if err != nil || len(recs) != 1 || len(warns) != 1 || !strings.Contains(warns[0], "r.jsonl:2: skipped an unfinished record") {
				t.Fatalf("cut %d: read %d records, err %v, warnings %q", cut, len(recs), err, warns)
			}
			if torn, err := CheckAppend(p); err != nil || torn != int64(cut) {
				t.Fatalf("cut %d: CheckAppend says %d torn bytes, err %v", cut, torn, err)
			}
			dropped, err := Append(p, sample(StatusFailed))
			if err != nil || dropped != int64(cut) {
				t.Fatalf("cut %d: append dropped %d bytes, err %v", cut, dropped, err)
			}
			warns = nil
			recs, err = ReadFile(p, collect(&warns))
			if err != nil || len(recs) != 2 || recs[1].Status != StatusFailed || len(warns) != 0 {
				t.Fatalf("cut %d: after the append, %d records, err %v, warnings %q", cut, len(recs), err, warns)
			}
		})
	}
}

// TestAppendLastLineWithoutNewline: a whole record missing only its
// newline is kept; a last line that is not a record is not appended to.
func TestAppendLastLineWithoutNewline(t *testing.T) {
	whole := line(t, sample(StatusOK))
	p := filepath.Join(t.TempDir(), "r.jsonl")
	os.WriteFile(p, whole[:len(whole)-1], 0o644)
	if recs, err := ReadFile(p, nil); err != nil || len(recs) != 1 {
		t.Fatalf("a whole last record without newline: %d records, %v", len(recs), err)
	}
	if dropped, err := Append(p, sample(StatusOK)); err != nil || dropped != 0 {
		t.Fatalf("append: dropped %d, %v", dropped, err)
	}
	if recs, err := ReadFile(p, nil); err != nil || len(recs) != 2 {
		t.Fatalf("after append: %d records, %v", len(recs), err)
	}
	for _, tail := range []string{"hello", `{"schema":"other/v1"`} {
		os.WriteFile(p, append(append([]byte{}, whole...), tail...), 0o644)
		before, _ := os.ReadFile(p)
		if _, err := Append(p, sample(StatusOK)); err == nil || !strings.Contains(err.Error(), "r.jsonl:2: the last line is not a moebench record") {
			t.Errorf("tail %q: append: %v", tail, err)
		}
		if after, _ := os.ReadFile(p); !bytes.Equal(before, after) {
			t.Errorf("tail %q: a refused append changed the file", tail)
		}
		if _, err := ReadFile(p, nil); err == nil || !strings.Contains(err.Error(), "r.jsonl:2: incomplete last line") {
			t.Errorf("tail %q: read: %v", tail, err)
		}
	}
}

// TestCheckAppend: what Append would refuse, or fail on, is found before
// any work, naming the line that is not a moebench record.
func TestCheckAppend(t *testing.T) {
	dir := t.TempDir()
	good := line(t, sample(StatusOK))
	other := strings.Replace(string(good), Schema, "other.record/v2", 1)
	file := func(name, body string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(body), 0o644)
		return p
	}
	for _, c := range []struct {
		path, want string
	}{
		{filepath.Join(dir, "missing", "r.jsonl"), "cannot create it"},
		{filepath.Join(file("afile", "x"), "r.jsonl"), "cannot create it"},
		{dir, "is a directory"},
		{file("text", "hello\nworld\n"), "text:1: not a moebench record (not a JSON object"},
		{file("other", string(good)+other), `other:2: not a moebench record (schema "other.record/v2"`},
		{file("torn-other", string(good)+"hello"), `torn-other:2: not a moebench record`},
		{"/sys/moebench-test.jsonl", "cannot create it"}, // read-only even for root
	} {
		if _, err := CheckAppend(c.path); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.path, err, c.want)
		}
	}
	if os.Geteuid() != 0 { // root writes read-only files
		ro := file("ro", string(good))
		os.Chmod(ro, 0o444)
		if _, err := CheckAppend(ro); err == nil || !strings.Contains(err.Error(), "cannot write it") {
			t.Errorf("read-only file: %v", err)
		}
	}
	fresh := filepath.Join(dir, "new.jsonl")
	if torn, err := CheckAppend(fresh); err != nil || torn != 0 {
		t.Errorf("new file: %d, %v", torn, err)
	}
	if _, err := os.Stat(fresh); !os.IsNotExist(err) {
		t.Errorf("CheckAppend left %s behind: %v", fresh, err)
	}
	if torn, err := CheckAppend(file("good", string(good)+string(good[:9]))); err != nil || torn != 9 {
		t.Errorf("good file with a torn tail: %d, %v", torn, err)
	}
	// the processes of a run over several check the same new --out at once
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				if _, err := CheckAppend(filepath.Join(dir, "shared.jsonl")); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("a new file checked by several at once: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*shared.jsonl*")); len(left) > 0 {
		t.Errorf("CheckAppend left %v behind", left)
	}
}

// endless is an input that never ends (like /dev/zero).
type endless byte

func (e endless) Read(b []byte) (int, error) {
	for i := range b {
		b[i] = byte(e)
	}
	return len(b), nil
}

// TestReadLimits: endless input stops at the line or the file limit.
func TestReadLimits(t *testing.T) {
	defer func(l, f int64) { maxLine, maxFile = l, f }(maxLine, maxFile)
	maxLine, maxFile = 1<<16, 1<<20
	if _, err := Read(endless(0), "/dev/zero", nil); err == nil || !strings.Contains(err.Error(), "/dev/zero:1: line longer than 65536 bytes") {
		t.Errorf("endless line: %v", err)
	}
	good := line(t, sample(StatusOK))
	many := io.MultiReader(bytes.NewReader(bytes.Repeat(good, 1+(1<<20)/len(good))), endless('\n'))
	if _, err := Read(many, "big", nil); err == nil || !strings.Contains(err.Error(), "big: more than 1048576 bytes") {
		t.Errorf("endless file: %v", err)
	}
	big := sample(StatusFailed)
	big.Reason = strings.Repeat("x", 1<<16)
	if _, err := Append(filepath.Join(t.TempDir(), "r.jsonl"), big); err == nil || !strings.Contains(err.Error(), "more than a results line may hold") {
		t.Errorf("append of an oversized record: %v", err)
	}
}

// appenderEnv makes TestAppenderProcess append big records to a file until
// it is killed.
const appenderEnv = "MOEBENCH_TEST_APPEND_TO"

// bigRecord is an 8 MB record.
func bigRecord() *Record {
	rec := sample(StatusFailed)
	rec.Reason = strings.Repeat("a reason to be long. ", 400_000)
	return rec
}

func TestAppenderProcess(t *testing.T) {
	path := os.Getenv(appenderEnv)
	if path == "" {
		t.Skip("helper process of TestAppendSurvivesKill")
	}
	for rec := bigRecord(); ; {
		if _, err := Append(path, rec); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAppendSurvivesKill kills (SIGKILL) a process appending 8 MB records
// when it sees the file grow by part of a record, then checks that the file
// reads with every whole record and that the next append heals it.
func TestAppendSurvivesKill(t *testing.T) {
	if testing.Short() {
		t.Skip("kills child processes")
	}
	size := int64(len(line(t, bigRecord())))
	for try := range 10 {
		p := filepath.Join(t.TempDir(), "r.jsonl")
		cmd := exec.Command(os.Args[0], "-test.run=^TestAppenderProcess$")
		cmd.Env = append(os.Environ(), appenderEnv+"="+p)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(30 * time.Second); ; { // a record whole, the next one partly written
			if st, err := os.Stat(p); err == nil && st.Size() > size && st.Size()%size != 0 {
				break
			}
			if time.Now().After(deadline) {
				cmd.Process.Kill()
				t.Fatal("the appender did not get past its first record in 30 s")
			}
		}
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		data, _ := os.ReadFile(p)
		whole := bytes.Count(data, []byte{'\n'})
		var warns []string
		recs, err := ReadFile(p, collect(&warns))
		if err != nil || len(recs) != whole {
			t.Fatalf("try %d: %d whole lines, read %d records: %v", try, whole, len(recs), err)
		}
		if data[len(data)-1] == '\n' {
			continue // the write ended before the kill; try again
		}
		torn := len(data) - (bytes.LastIndexByte(data, '\n') + 1)
		if len(warns) != 1 {
			t.Fatalf("try %d: a %d-byte torn tail read with warnings %q", try, torn, warns)
		}
		dropped, err := Append(p, sample(StatusOK))
		if err != nil || dropped != int64(torn) {
			t.Fatalf("try %d: append after the kill dropped %d of %d torn bytes: %v", try, dropped, torn, err)
		}
		if recs, err = ReadFile(p, nil); err != nil || len(recs) != whole+1 || recs[whole].Status != StatusOK {
			t.Fatalf("try %d: after healing, %d records (want %d): %v", try, len(recs), whole+1, err)
		}
		t.Logf("try %d: the kill tore a record after %d of its %d bytes; the %d whole records before it were kept", try, torn, size, whole)
		return
	}
	t.Skip("no kill landed inside a write in 10 tries (the torn-tail handling is tested directly by TestAppendHealsTornTail)")
}

// TestAppendJSON: results of another schema are appended whole, one a line,
// to a new file or one of their own; a file holding anything else (run
// records, another schema, an unfinished last line) is refused by the check
// and left as it was.
func TestAppendJSON(t *testing.T) {
	dir := t.TempDir()
	type result struct {
		Schema string `json:"schema"`
		N      int    `json:"n"`
	}
	path := filepath.Join(dir, "b.jsonl")
	for n := 1; n <= 2; n++ {
		if err := CheckAppendJSON(path, "x/v1"); err != nil {
			t.Fatalf("check before result %d: %v", n, err)
		}
		if err := AppendJSON(path, result{"x/v1", n}); err != nil {
			t.Fatal(err)
		}
	}
	if b, _ := os.ReadFile(path); string(b) != "{\"schema\":\"x/v1\",\"n\":1}\n{\"schema\":\"x/v1\",\"n\":2}\n" {
		t.Errorf("file after two appends: %q", b)
	}
	for name, c := range map[string]struct{ body, want string }{
		"other":  {"{\"schema\":\"y/v1\"}\n", `b2.jsonl:1: not a x/v1 result (schema "y/v1")`},
		"text":   {"{\"schema\":\"x/v1\"}\nhello\n", "b2.jsonl:2: not a x/v1 result (not a JSON object)"},
		"torn":   {"{\"schema\":\"x/v1\"}\n{\"sch", "b2.jsonl:2: the last line is unfinished"},
		"record": {`{"schema":"` + Schema + `"}` + "\n", `(schema "` + Schema + `")`},
	} {
		p := filepath.Join(dir, name, "b2.jsonl")
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte(c.body), 0o644)
		if err := CheckAppendJSON(p, "x/v1"); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
		if b, _ := os.ReadFile(p); string(b) != c.body {
			t.Errorf("%s: the check changed the file: %q", name, b)
		}
	}
	if err := CheckAppendJSON(dir, "x/v1"); err == nil || !strings.Contains(err.Error(), "is a directory") {
		t.Errorf("a directory: %v", err)
	}
}
