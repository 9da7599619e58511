package results

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
)

// Limits of a results file: its longest line and its size. A record of the
// largest layers moebench accepts takes a few MiB.
const (
	MaxLineBytes = 256 << 20
	MaxFileBytes = 4 << 30
)

// maxLine and maxFile are the limits in force (tests lower them).
var maxLine, maxFile int64 = MaxLineBytes, MaxFileBytes

// Append adds rec as one line to the JSONL file at path, creating it if
// needed. The line is written whole or not at all: the file is locked, a
// failed or short write is cut back to the previous size, and the data is
// synced before Append returns. A file may end in an unfinished record (a
// writer killed while appending); under the lock Append cuts it off first and
// returns how many bytes it dropped. A last line that is a whole record
// without its newline gets the newline; one that is neither is not
// appended to.
func Append(path string, rec *Record) (dropped int64, err error) {
	line, err := json.Marshal(rec)
	if err != nil {
		return 0, fmt.Errorf("encode record: %w", err)
	}
	line = append(line, '\n')
	if int64(len(line)) > maxLine {
		return 0, fmt.Errorf("the record is %d bytes, more than a results line may hold (%d)", len(line), maxLine)
	}
	err = appendLocked(path, func(f *os.File, size int64) ([]byte, int64, error) {
		start, tail, err := lastLine(f, size)
		if err != nil {
			return nil, 0, fmt.Errorf("%s: %w", path, err)
		}
		switch lineKind(tail) {
		case lineRecord: // whole, only its newline is missing
			return append([]byte{'\n'}, line...), size, nil
		case lineTorn:
			if err := f.Truncate(start); err != nil {
				return nil, 0, fmt.Errorf("%s: cutting off an unfinished last record: %w", path, err)
			}
			dropped = size - start
			return line, start, nil
		case lineOther:
			n, _ := countLines(f, start)
			return nil, 0, fmt.Errorf("%s:%d: the last line is not a moebench record; not appending to this file", path, n+1)
		}
		return line, size, nil
	})
	return dropped, err
}

// appendLocked opens path for appending (creating it), locks it, and writes
// the line that prepare returns, given the open file and its size; prepare
// may cut the file back and returns the size the file has then. The line is
// written whole or not at all: a failed or short write is cut back to that
// size, and the data is synced before appendLocked returns.
func appendLocked(path string, prepare func(f *os.File, size int64) (line []byte, size2 int64, err error)) (err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", path, err)
	}
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", path)
	}
	line, size, err := prepare(f, st.Size())
	if err != nil {
		return err
	}
	if _, err := f.Write(line); err != nil {
		if terr := f.Truncate(size); terr != nil {
			return fmt.Errorf("write %s: %v; and cutting back the partial line failed: %v", path, err, terr)
		}
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Sync()
}

// AppendJSON adds v as one JSON line to the file at path, creating it if
// needed, whole or not at all (locked, cut back on a failed write, synced).
// It is for results files of another schema than Record's (the benchmarks'),
// which CheckAppendJSON checked before the work.
func AppendJSON(path string, v any) error {
	line, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode result: %w", err)
	}
	return appendLocked(path, func(_ *os.File, size int64) ([]byte, int64, error) {
		return append(line, '\n'), size, nil
	})
}

// CheckAppendJSON tells, before any work, whether AppendJSON of results of
// schema to path can succeed: a new file must be creatable; an existing one
// must be a writable regular file whose every line is a whole JSON object
// of that schema, so that a results file of another kind (run records,
// another benchmark's) is never written to. An unfinished last line is
// refused, not cut off: such files are not records, which Append repairs.
func CheckAppendJSON(path, schema string) error {
	f, err := openToAppend(path, "results")
	if f == nil || err != nil {
		return err
	}
	defer f.Close()
	return scan(f, path, func(ln int, line []byte, last bool) error {
		if last {
			return fmt.Errorf("%s:%d: the last line is unfinished (no newline); not appending to this file", path, ln)
		}
		var head struct {
			Schema string `json:"schema"`
		}
		if jerr := json.Unmarshal(line, &head); jerr != nil || head.Schema != schema {
			what := fmt.Sprintf("schema %q", head.Schema)
			if jerr != nil {
				what = "not a JSON object"
			}
			return fmt.Errorf("%s:%d: not a %s result (%s); give a new file or one of earlier %s results", path, ln, schema, what, schema)
		}
		return nil
	})
}

// openToAppend opens the existing file path for reading before an append;
// for a new file (nil, nil) it checks instead that a file can be created
// beside it (not path itself, which another process of the run may be
// checking too). what names the lines a directory was given for.
func openToAppend(path, what string) (*os.File, error) {
	st, err := os.Stat(path)
	if err != nil {
		f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".check-*")
		if err != nil {
			return nil, fmt.Errorf("cannot create it: %w", err)
		}
		f.Close()
		return nil, os.Remove(f.Name())
	}
	if st.IsDir() {
		return nil, fmt.Errorf("is a directory; give a file to append %s to", what)
	}
	if !st.Mode().IsRegular() {
		return nil, errors.New("is not a regular file")
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND, 0)
	if err != nil {
		return nil, fmt.Errorf("cannot write it: %w", err)
	}
	return f, nil
}

// lastLine returns the start and the bytes of an unterminated last line of
// f (size bytes long); none when f is empty or ends in a newline.
func lastLine(f *os.File, size int64) (int64, []byte, error) {
	if size == 0 {
		return 0, nil, nil
	}
	var block [64 << 10]byte
	end := size
	for end > 0 && size-end <= maxLine {
		n := min(end, int64(len(block)))
		b := block[:n]
		if _, err := f.ReadAt(b, end-n); err != nil {
			return 0, nil, err
		}
		if end == size && b[n-1] == '\n' {
			return size, nil, nil
		}
		if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
			end = end - n + int64(i) + 1
			break
		}
		end -= n
	}
	if size-end > maxLine {
		return 0, nil, fmt.Errorf("the last line is longer than %d bytes: not a results file", maxLine)
	}
	tail := make([]byte, size-end)
	_, err := f.ReadAt(tail, end)
	return end, tail, err
}

// countLines counts the newlines in f's first n bytes.
func countLines(f *os.File, n int64) (int, error) {
	br := bufio.NewReader(io.NewSectionReader(f, 0, n))
	lines := 0
	for {
		b, err := br.ReadSlice('\n')
		lines += bytes.Count(b, []byte{'\n'})
		if err == io.EOF {
			return lines, nil
		}
		if err != nil && err != bufio.ErrBufferFull {
			return lines, err
		}
	}
}

// Kinds of an unterminated last line.
const (
	lineNone   = iota // there is none
	lineRecord        // a whole record, its newline missing
	lineTorn          // the start of a record: a writer stopped while appending it
	lineOther         // anything else
)

// recordStart is how every record moebench writes begins.
var recordStart = []byte(`{"schema":"` + Schema + `"`)

func lineKind(tail []byte) int {
	switch {
	case len(tail) == 0:
		return lineNone
	case parseErr(tail) == nil:
		return lineRecord
	case bytes.HasPrefix(tail, recordStart) || bytes.HasPrefix(recordStart, tail):
		return lineTorn
	}
	return lineOther
}

func parseErr(line []byte) error {
	_, err := parseLine(line)
	return err
}

// CheckAppend tells, before any work, whether Append to path can succeed: a
// new file must be creatable; an existing one must be a writable regular
// file holding only moebench records (the error names the first line that
// is not one). It returns how many bytes of an unfinished last record the
// first Append will cut off (0 for none).
func CheckAppend(path string) (torn int64, err error) {
	f, err := openToAppend(path, "records")
	if f == nil || err != nil {
		return 0, err
	}
	defer f.Close()
	err = scan(f, path, func(ln int, line []byte, last bool) error {
		perr := parseErr(line)
		switch {
		case perr == nil:
		case last && lineKind(line) == lineTorn:
			torn = int64(len(line))
		default:
			return fmt.Errorf("%s:%d: not a moebench record (%v); give a new file or a moebench results file", path, ln, perr)
		}
		return nil
	})
	return torn, err
}

// ReadFile reads every record of a JSONL file. It is strict: a malformed line,
// an unknown field or an unknown schema is an error naming the file and line.
// An unfinished last record (a writer killed while appending it) is skipped,
// and warn (when not nil) is told so.
func ReadFile(path string, warn func(string)) ([]Record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Read(f, path, warn)
}

// Read reads records from r as ReadFile does; name is used in messages.
func Read(r io.Reader, name string, warn func(string)) ([]Record, error) {
	var out []Record
	err := scan(r, name, func(ln int, line []byte, last bool) error {
		rec, err := parseLine(line)
		if err == nil {
			err = Validate(&rec)
			if err != nil {
				return fmt.Errorf("%s:%d: %v", name, ln, err)
			}
		}
		switch {
		case err == nil:
			mapOldNames(&rec)
			out = append(out, rec)
		case last && lineKind(line) == lineTorn:
			if warn != nil {
				warn(fmt.Sprintf("%s:%d: skipped an unfinished record at the end (%d bytes without a newline: a writer stopped while appending it; the next append cuts it off)", name, ln, len(line)))
			}
		case last:
			return fmt.Errorf("%s:%d: incomplete last line (no newline): %v", name, ln, err)
		default:
			return fmt.Errorf("%s:%d: %v", name, ln, err)
		}
		return nil
	})
	return out, err
}

// scan calls fn on each line of r (without its newline); last marks a final
// line that has no newline. Lines longer than MaxLineBytes and input longer
// than MaxFileBytes are errors.
func scan(r io.Reader, name string, fn func(ln int, line []byte, last bool) error) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var total int64
	var line []byte
	for ln := 1; ; ln++ {
		line = line[:0]
		var err error
		for {
			var frag []byte
			frag, err = br.ReadSlice('\n')
			line = append(line, frag...)
			total += int64(len(frag))
			if int64(len(line)) > maxLine {
				return fmt.Errorf("%s:%d: line longer than %d bytes: not a results file", name, ln, maxLine)
			}
			if total > maxFile {
				return fmt.Errorf("%s: more than %d bytes: larger than a results file moebench reads (split it)", name, maxFile)
			}
			if err != bufio.ErrBufferFull {
				break
			}
		}
		if err != nil && err != io.EOF {
			return fmt.Errorf("%s:%d: %w", name, ln, err)
		}
		complete := len(line) > 0 && line[len(line)-1] == '\n'
		if complete {
			if ferr := fn(ln, bytes.TrimSpace(line), false); ferr != nil {
				return ferr
			}
		} else if len(line) > 0 {
			return fn(ln, line, true)
		}
		if err == io.EOF {
			return nil
		}
	}
}

func parseLine(line []byte) (Record, error) {
	var rec Record
	if len(line) == 0 {
		return rec, errors.New("empty line")
	}
	var head struct {
		Schema string `json:"schema"`
	}
	if err := json.Unmarshal(line, &head); err != nil {
		return rec, fmt.Errorf("not a JSON object: %v", err)
	}
	if head.Schema != Schema {
		return rec, fmt.Errorf("schema %q is not supported (this moebench reads %q)", head.Schema, Schema)
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rec); err != nil {
		return rec, fmt.Errorf("bad record: %v", err)
	}
	if dec.More() {
		return rec, errors.New("trailing data after the record")
	}
	switch rec.Status {
	case StatusOK, StatusFailed, StatusUnavailable:
	default:
		return rec, fmt.Errorf("status %q is not ok, failed or unavailable", rec.Status)
	}
	if rec.Status != StatusOK && rec.Timing != nil {
		return rec, fmt.Errorf("a %s record carries timings", rec.Status)
	}
	return rec, checkSections(&rec)
}

// checkSections refuses an ok record without the sections every ok record
// has (what reports and comparisons read), naming the first one missing.
func checkSections(rec *Record) error {
	if rec.Status != StatusOK {
		return nil
	}
	missing := ""
	switch {
	case rec.Timing == nil:
		missing = "timing"
	case len(rec.Timing.Step.Samples) == 0:
		missing = "timing.step.samples"
	case rec.Tokens == nil:
		missing = "tokens"
	case rec.GEMM == nil:
		missing = "gemm"
	case rec.Traffic == nil:
		missing = "traffic"
	default:
		return nil
	}
	return fmt.Errorf("an ok record without %q", missing)
}
