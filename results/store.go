package results

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// Append adds rec as one line to the JSONL file at path, creating it if
// needed. The line is written whole or not at all: the file is locked, a
// failed or short write is cut back to the previous size, and the data is
// synced before Append returns. A file whose last line is incomplete is
// refused rather than appended to.
func Append(path string, rec *Record) (err error) {
	line, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encode record: %w", err)
	}
	line = append(line, '\n')
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
	size := st.Size()
	if size > 0 {
		last := make([]byte, 1)
		if _, err := f.ReadAt(last, size-1); err != nil {
			return fmt.Errorf("read %s: %w", path, err)
		}
		if last[0] != '\n' {
			return fmt.Errorf("%s: last line is incomplete (no trailing newline); not appending to a damaged file", path)
		}
	}
	if _, err := f.Write(line); err != nil {
		if terr := f.Truncate(size); terr != nil {
			return fmt.Errorf("write %s: %v; and cutting back the partial line failed: %v", path, err, terr)
		}
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Sync()
}

// ReadFile reads every record of a JSONL file. It is strict: a malformed line,
// an unknown field or an unknown schema is an error naming the file and line.
func ReadFile(path string) ([]Record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Read(f, path)
}

// Read reads records from r; name is used in errors.
func Read(r io.Reader, name string) ([]Record, error) {
	var out []Record
	br := bufio.NewReader(r)
	for ln := 1; ; ln++ {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			if line[len(line)-1] != '\n' {
				return out, fmt.Errorf("%s:%d: incomplete last line (no newline)", name, ln)
			}
			rec, perr := parseLine(bytes.TrimSpace(line))
			if perr != nil {
				return out, fmt.Errorf("%s:%d: %v", name, ln, perr)
			}
			out = append(out, rec)
		}
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("%s:%d: %w", name, ln, err)
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
	return rec, nil
}
