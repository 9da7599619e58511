package launch

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// The files of a rendezvous (FILE, FILE.run, FILE.pN.*) all begin with
// marker's line: a path that holds anything else is not moebench's, and
// is never replaced or removed (a user's results file named by mistake).
const marker = "moebench rendezvous 1"

// Files beside FILE as moebench before the marker wrote them: their names
// (side) and their first lines (legacy: FILE.run's and an agreement's tag,
// a hello, a status's or note's watch tag).
var (
	side   = regexp.MustCompile(`^\.(run|p[0-9]+\.(hello|agree[0-9]+|status|failed))$`)
	legacy = regexp.MustCompile(`^(run [0-9a-f]+ world [0-9]+ job ".*"|[0-9a-f]+|[0-9a-f]+\.[0-9]+)$`)
)

// mine says whether path is free for r to write: it does not exist, or
// it is a file a rendezvous wrote (its first line is marker's) — or,
// beside FILE, one an older moebench wrote without the marker (a
// successful run left FILE.pN.agree1), known by its name and first line;
// else what it is.
func (r *Rendezvous) mine(path string) (bool, string) {
	ok, what, head := inspect(path)
	if !ok && r.File != "" && strings.HasPrefix(path, r.File) && side.MatchString(path[len(r.File):]) && legacy.MatchString(head) {
		return true, ""
	}
	return ok, what
}

// inspect says whether path does not exist or begins with marker's line;
// else what it is, and its first line (without its line break).
func inspect(path string) (bool, string, string) {
	st, err := os.Lstat(path)
	if os.IsNotExist(err) {
		return true, "", ""
	}
	if err != nil {
		return false, err.Error(), ""
	}
	if st.IsDir() {
		return false, "a directory", ""
	}
	if !st.Mode().IsRegular() {
		return false, fmt.Sprintf("not a regular file (%s)", st.Mode().Type()), ""
	}
	f, err := os.Open(path)
	if err != nil {
		return false, err.Error(), ""
	}
	defer f.Close()
	head, _ := bufio.NewReader(io.LimitReader(f, 4096)).ReadString('\n')
	if head == marker+"\n" || strings.HasPrefix(head, marker+" ") {
		return true, "", head
	}
	return false, describe(head, st.Size()), strings.TrimSuffix(head, "\n")
}

// describe says what a file that is not a rendezvous's is, from its first line.
func describe(head string, size int64) string {
	line := strings.TrimRight(head, "\r\n")
	var obj map[string]any
	switch {
	case size == 0:
		return "an empty file"
	case json.Unmarshal([]byte(line), &obj) == nil:
		if s, _ := obj["schema"].(string); strings.HasPrefix(s, "moebench") {
			return fmt.Sprintf("a moebench results file (JSON lines, %d bytes, schema %s)", size, s)
		}
		return fmt.Sprintf("a JSON file of %d bytes", size)
	}
	if len(line) > 40 {
		line = line[:40] + "…"
	}
	return fmt.Sprintf("a file of %d bytes that begins %q", size, line)
}

// notOurs is the error for a path the rendezvous would write that holds
// something else.
func notOurs(file, path, what string) error {
	if path == file {
		return fmt.Errorf("--rendezvous=%s: the path exists and is not a rendezvous file (it is %s); moebench writes FILE, FILE.run and FILE.pN.* itself and "+
			"never replaces or removes a file it did not write: name a path that does not exist, in a folder every node sees", file, what)
	}
	return fmt.Errorf("--rendezvous=%s: %s exists and is not a rendezvous file (it is %s); moebench writes FILE, FILE.run and FILE.pN.* itself and "+
		"never replaces or removes a file it did not write: name another FILE", file, path, what)
}

// put writes text to path, after marker's line (with kind), through a
// temporary file beside it, so that a reader sees all of it or nothing;
// a path that holds something not ours is never replaced.
func (r *Rendezvous) put(path, kind, text string) error {
	if ok, what := r.mine(path); !ok {
		return notOurs(r.File, path, what)
	}
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("--rendezvous: %w", err)
	}
	_, err = f.WriteString(marker + " " + kind + "\n" + text)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("--rendezvous: %w", err)
	}
	return nil
}

// get is what put wrote at path (false: no file of ours there).
func get(path string) (string, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", false
	}
	head, text, ok := strings.Cut(string(b), "\n")
	if !ok || head != marker && !strings.HasPrefix(head, marker+" ") {
		return "", false
	}
	return text, true
}

// drop removes path when it is a file of ours.
func (r *Rendezvous) drop(path string) {
	if ok, _ := r.mine(path); ok {
		os.Remove(path)
	}
}
