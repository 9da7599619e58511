package results

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestWrapLine: a long line is cut at spaces into lines of at most the
// width, the words kept in order; a "# label   value" line continues under
// its value, a note under its text, a table row four columns in.
func TestWrapLine(t *testing.T) {
	words := strings.Repeat("word ", 60)
	for _, c := range []struct{ line, cont string }{
		{"# " + padRight("steps", 22) + " " + words, "#" + strings.Repeat(" ", 24)},
		{"#   deepep/native sms=16 unavailable: " + words, "#     "},
		{"# title " + words, "#   "},
		{"  row " + words, "      "},
		{"# " + strings.Repeat("x", 300), "#   "}, // one word longer than a line: cut where it must be
	} {
		got := WrapLine(c.line, 120)
		if len(got) < 2 {
			t.Fatalf("%q not wrapped", c.line)
		}
		for i, l := range got {
			if n := utf8.RuneCountInString(l); n > 120 {
				t.Errorf("line %d: %d columns", i, n)
			}
			if i > 0 && !strings.HasPrefix(l, c.cont) {
				t.Errorf("continuation %q does not start with %q", l, c.cont)
			}
		}
		sep := " "
		if strings.HasPrefix(c.line, "# x") {
			sep = ""
		}
		joined := got[0]
		for _, l := range got[1:] {
			joined += sep + strings.TrimPrefix(l, c.cont)
		}
		if strings.Join(strings.Fields(joined), " ") != strings.Join(strings.Fields(c.line), " ") {
			t.Errorf("words lost or moved:\n%q\n%q", joined, c.line)
		}
	}
	if got := WrapLine("# short line", 120); len(got) != 1 || got[0] != "# short line" {
		t.Errorf("a short line changed: %q", got)
	}
}

func padRight(s string, n int) string { return s + strings.Repeat(" ", n-len(s)) }

// TestFitColumns: columns are kept from the left while the table fits;
// the first keep stay whatever their width; the others are named.
func TestFitColumns(t *testing.T) {
	rows := [][]string{{"a", "bb", "ccc", "dddd"}, {strings.Repeat("x", 30), "1", "2", "3"}}
	got, left := FitColumns(rows, 41, 1) // 32 + 4 + 5
	if len(got[0]) != 3 || strings.Join(left, ",") != "dddd" {
		t.Errorf("fit 40: %v, left out %v", got, left)
	}
	if got, left = FitColumns(rows, 10, 1); len(got[0]) != 1 || len(left) != 3 {
		t.Errorf("fit 10: %v, left out %v", got, left)
	}
	var b bytes.Buffer
	got, _ = FitColumns(rows, 41, 1)
	WriteAligned(&b, got, 1)
	for _, l := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		if utf8.RuneCountInString(l) > 41 {
			t.Errorf("%q wider than 41", l)
		}
	}
	if s := Truncate("a-very-long-name", 8); s != "a-very-…" {
		t.Errorf("Truncate: %q", s)
	}
}

// TestReportWidths: the default report table fits TermWidth (a long
// dispatcher name cut, the reasons in full below), and width 0 is
// WriteReport's table, every column.
func TestReportWidths(t *testing.T) {
	recs := reportRecords()
	recs[3].Config.Dispatcher = strings.Repeat("long-name-", 6)
	recs[3].Reason = strings.Repeat("a reason longer than a line ", 8)
	groups := BuildReport(recs)
	var narrow, wide, want bytes.Buffer
	if err := WriteReportWidth(&narrow, groups, "table", "", TermWidth); err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(narrow.String(), "\n") {
		if utf8.RuneCountInString(l) > TermWidth {
			t.Errorf("%d columns: %s", utf8.RuneCountInString(l), l)
		}
	}
	flat := strings.Join(strings.Fields(strings.ReplaceAll(narrow.String(), "\n#", " ")), " ")
	if !strings.Contains(flat, strings.TrimSpace(strings.Join(strings.Fields(recs[3].Reason), " "))) || !strings.Contains(narrow.String(), "long-name-long-…") {
		t.Errorf("narrow report:\n%s", narrow.String())
	}
	WriteReportWidth(&wide, groups, "table", "", 0)
	WriteReport(&want, groups, "table", "")
	if wide.String() != want.String() {
		t.Errorf("width 0 is not the full table")
	}
	for _, f := range []string{"markdown", "csv"} { // the other formats keep every column
		wide.Reset()
		want.Reset()
		WriteReportWidth(&wide, groups, f, "t", TermWidth)
		WriteReport(&want, groups, f, "t")
		if wide.String() != want.String() {
			t.Errorf("%s changed with a width", f)
		}
	}
}
