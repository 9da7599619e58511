package advise

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
)

// HistorySchema names a line of the history file.
const HistorySchema = "moebench.advise-history/v1"

// Entry is one answer in the history: enough to tell whether the winner
// changed since the last answer to the same question.
type Entry struct {
	Schema    string `json:"schema"`
	Time      string `json:"time"`
	Question  string `json:"question"` // the workload and the hardware
	Winner    string `json:"winner"`
	RunnerUp  string `json:"runner_up,omitempty"`
	Separated bool   `json:"separated"`
	Summary   string `json:"summary"`
	Out       string `json:"out,omitempty"` // the folder of the answer and its records
}

// question is what makes two answers answers to the same question: the
// workload, its precision (bf16 unsaid, as in older entries) and the
// hardware.
func (a *Answer) question() string {
	hw := a.Device
	if a.GPU != "" {
		hw = a.GPU
	}
	w := a.Workload
	if p := " precision=" + a.Precision; a.Precision != "" && !strings.Contains(w, p) {
		w += p
	}
	return w + " on " + hw
}

// maxHistoryLine bounds a history line.
const maxHistoryLine = 1 << 20

// ReadHistory reads the history file; a file that does not exist is an
// empty history.
func ReadHistory(path string) ([]Entry, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Entry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), maxHistoryLine)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var e Entry
		if err := json.Unmarshal([]byte(line), &e); err != nil || e.Schema != HistorySchema {
			return nil, fmt.Errorf("%s line %d: not a moebench advise history entry (schema %s)", path, n, HistorySchema)
		}
		out = append(out, e)
	}
	return out, sc.Err()
}

// AppendHistory appends the answer to the history file and returns, when
// the last answer there to the same question named another winner, a
// sentence that says so ("" otherwise).
func AppendHistory(path string, a *Answer, out string) (string, error) {
	old, err := ReadHistory(path)
	if err != nil {
		return "", err
	}
	e := Entry{Schema: HistorySchema, Time: a.Time, Question: a.question(), Winner: a.Decision.Winner, RunnerUp: a.Decision.RunnerUp,
		Separated: a.Decision.Separated, Summary: a.Decision.Summary, Out: out}
	change := ""
	for i := len(old) - 1; i >= 0; i-- {
		if p := old[i]; p.Question == e.Question {
			if p.Winner != e.Winner {
				change = fmt.Sprintf("the winner changed since %s: %s then (%s), %s now (%s)", p.Time, orNone(p.Winner), separated(p.Separated), orNone(e.Winner), separated(e.Separated))
			}
			break
		}
	}
	b, err := json.Marshal(e)
	if err != nil {
		return "", err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return "", err
	}
	_, err = f.Write(append(b, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return change, err
}

// CheckHistory says why path cannot serve as the history file, before any
// work.
func CheckHistory(path string) error {
	if _, err := ReadHistory(path); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

func orNone(w string) string {
	if w == "" {
		return "none"
	}
	return w
}

func separated(s bool) string {
	if s {
		return "separated from its runner-up"
	}
	return "not separated from its runner-up"
}
