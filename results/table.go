package results

import (
	"io"
	"strings"
	"unicode/utf8"
)

// WriteAligned prints rows (rows[0] is the header) in fixed-width columns,
// nccl-tests style: the header line starts with "# ", the others with two
// spaces; the first left columns are left-aligned, the rest right-aligned.
func WriteAligned(w io.Writer, rows [][]string, left int) error {
	width := map[int]int{}
	for _, row := range rows {
		for j, c := range row {
			width[j] = max(width[j], utf8.RuneCountInString(c))
		}
	}
	p := &printer{w: w}
	for i, row := range rows {
		var b strings.Builder
		if i == 0 {
			b.WriteString("# ")
		} else {
			b.WriteString("  ")
		}
		for j, c := range row {
			pad := strings.Repeat(" ", width[j]-utf8.RuneCountInString(c))
			if j < left {
				b.WriteString(c + pad + "  ")
			} else {
				b.WriteString(pad + c + "  ")
			}
		}
		p.f("%s\n", strings.TrimRight(b.String(), " "))
	}
	return p.err
}

// WriteMarkdownTable prints rows (rows[0] is the header) as a Markdown
// table; the first left columns are left-aligned, the rest right-aligned.
// '|' in cells is escaped.
func WriteMarkdownTable(w io.Writer, rows [][]string, left int) error {
	p := &printer{w: w}
	for i, row := range rows {
		p.f("|")
		for _, c := range row {
			p.f(" %s |", strings.ReplaceAll(c, "|", `\|`))
		}
		p.f("\n")
		if i == 0 {
			p.f("|")
			for j := range row {
				if j < left {
					p.f("---|")
				} else {
					p.f("---:|")
				}
			}
			p.f("\n")
		}
	}
	return p.err
}
