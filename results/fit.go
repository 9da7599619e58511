package results

import (
	"bytes"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"
)

// TermWidth is the width, in columns, that moebench's default (terminal)
// tables fit; --wide prints every column, however wide, as the record
// holds them all (CSV and JSON keep every field either way).
const TermWidth = 120

// FitColumns keeps the first columns of rows (rows[0] is the header), in
// order, as long as the table printed with WriteAligned (or a tabwriter
// with two columns of padding) fits width; the first keep columns stay
// whatever their width. It returns the table and the headers of the
// columns left out. Columns are ordered most-read first by the caller, so
// what is left out is what is read least.
func FitColumns(rows [][]string, width, keep int) ([][]string, []string) {
	if len(rows) == 0 {
		return rows, nil
	}
	n := 0
	used := 0
	for j := range rows[0] {
		w := 0
		for _, r := range rows {
			if j < len(r) {
				w = max(w, utf8.RuneCountInString(r[j]))
			}
		}
		if j >= keep && used+w+2 > width {
			break
		}
		used += w + 2
		n = j + 1
	}
	out := make([][]string, len(rows))
	for i, r := range rows {
		out[i] = r[:min(n, len(r))]
	}
	return out, append([]string(nil), rows[0][n:]...)
}

// Truncate shortens s to at most n columns, its end replaced by "…".
func Truncate(s string, n int) string {
	if utf8.RuneCountInString(s) <= n || n < 1 {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// LeftOut is the line that names the columns a default table left out.
func LeftOut(cols []string) string {
	if len(cols) == 0 {
		return ""
	}
	return "# not shown at " + strconv.Itoa(TermWidth) + " columns (--wide shows them): " + strings.Join(cols, ", ") + "\n"
}

// FitWriter returns a writer that passes whole lines to w, each longer
// than width wrapped at spaces (see WrapLine), and its flush, which
// writes what is left of an unfinished last line; it returns the first
// error.
func FitWriter(w io.Writer, width int) (io.Writer, func() error) {
	f := &fitter{w: w, width: width}
	return f, f.flush
}

type fitter struct {
	w     io.Writer
	width int
	buf   bytes.Buffer
	err   error
}

func (f *fitter) Write(p []byte) (int, error) {
	f.buf.Write(p)
	for f.err == nil {
		i := bytes.IndexByte(f.buf.Bytes(), '\n')
		if i < 0 {
			break
		}
		line := string(f.buf.Next(i + 1))
		f.out(strings.TrimSuffix(line, "\n"), true)
	}
	return len(p), f.err
}

func (f *fitter) out(line string, nl bool) {
	for i, l := range WrapLine(line, f.width) {
		if f.err != nil {
			return
		}
		if i > 0 || nl {
			l += "\n"
		}
		_, f.err = io.WriteString(f.w, l)
	}
}

func (f *fitter) flush() error {
	if f.buf.Len() > 0 && f.err == nil {
		f.out(f.buf.String(), false)
		f.buf.Reset()
	}
	return f.err
}

// WrapLine cuts line into lines of at most width columns at spaces (a
// word longer than a line is cut where it must be). The lines after the
// first are indented to show they continue it: a comment line ('#') of a
// label and its value ("# label    value") continues under the value,
// another comment line two columns past its own indentation, both
// starting with '#'; any other line four columns past its indentation.
func WrapLine(line string, width int) []string {
	if utf8.RuneCountInString(line) <= width || width < 20 {
		return []string{line}
	}
	cont := contIndent(line)
	var out []string
	first := true
	rest := []rune(line)
	for {
		prefix := []rune(nil)
		if !first {
			prefix = []rune(cont)
		}
		room := width - len(prefix)
		if len(rest) <= room {
			out = append(out, string(prefix)+string(rest))
			return out
		}
		cut := -1
		for i := room; i > 0; i-- { // the last space within the room, past the line's indentation
			if rest[i] == ' ' && strings.TrimSpace(string(rest[:i])) != "" && strings.TrimSpace(string(rest[:i])) != "#" {
				cut = i
				break
			}
		}
		head, tail := rest, []rune(nil)
		if cut < 0 {
			head, tail = rest[:room], rest[room:]
		} else {
			head, tail = rest[:cut], rest[cut:]
		}
		out = append(out, strings.TrimRight(string(prefix)+string(head), " "))
		rest = []rune(strings.TrimLeft(string(tail), " "))
		first = false
		if len(rest) == 0 {
			return out
		}
	}
}

// contIndent is the indentation of line's continuation lines.
func contIndent(line string) string {
	lead := len(line) - len(strings.TrimLeft(line, " "))
	if !strings.HasPrefix(line, "#") {
		return strings.Repeat(" ", lead+4)
	}
	body := line[1:]
	pad := len(body) - len(strings.TrimLeft(body, " "))
	// "# label   value": the value starts after a run of two spaces or
	// more, within the first 32 columns
	rs := []rune(line)
	for i := 1 + pad; i < len(rs)-2 && i < 32; i++ {
		if rs[i] == ' ' && rs[i+1] == ' ' {
			j := i
			for j < len(rs) && rs[j] == ' ' {
				j++
			}
			if j < 32 && j < len(rs) {
				return "#" + strings.Repeat(" ", j-1)
			}
			break
		}
	}
	return "#" + strings.Repeat(" ", pad+2)
}
