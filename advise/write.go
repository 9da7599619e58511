package advise

import (
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"sort"
	"strings"

	"github.com/moebench/moebench/harness/setup"
	"github.com/moebench/moebench/results"
)

// Formats are the answer's formats.
var Formats = []string{"text", "markdown", "html", "json"}

// Reproduce is the one-line command that runs c again: its preset, then
// every setting where c differs from what the preset and the defaults
// give (setup.Settings: each Config field by its flag), with --ep,
// --dispatcher, --impl and --device always said.
func Reproduce(c setup.Config) string {
	base := strings.TrimSuffix(c.Preset, "+custom")
	if c.HostExperts == "" { // "" is auto, as "" is bf16
		c.HostExperts = setup.HostExpertsAuto
	}
	if c.Precision == "" {
		c.Precision = setup.PrecisionBF16
	}
	ref := setup.DefaultConfig()
	ref.Shape, ref.HostExperts = setup.Shape{}, setup.HostExpertsAuto
	if p, ok := setup.LookupPreset(base); ok {
		ref.Shape = p.Shape
	}
	have, def := setup.Settings(c), setup.Settings(ref)
	args := []string{"moebench", "--preset", shellWord(base)}
	value := map[string]string{}
	for _, s := range have {
		value[s.Name] = s.Value
	}
	for i, s := range have {
		switch s.Name {
		case "--preset", "--ep", "--impl", "--device":
			continue
		case "--dispatcher": // after the layer, with the ranks and the implementation
			args = append(args, "--ep", value["--ep"], "--dispatcher", shellWord(s.Value), "--impl", shellWord(value["--impl"]))
			continue
		}
		if s.Value == def[i].Value {
			continue
		}
		switch s.Value {
		case "true":
			args = append(args, s.Name)
		case "false":
			args = append(args, s.Name+"=false")
		default:
			args = append(args, s.Name, shellWord(s.Value))
		}
	}
	return strings.Join(append(args, "--device", shellWord(value["--device"])), " ")
}

// shellWord is v as one word of a shell's command line: as it is when it
// has no character a shell reads, else single-quoted.
func shellWord(v string) string {
	if v != "" && strings.Trim(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./:+,=@%-") == "" {
		return v
	}
	return "'" + strings.ReplaceAll(v, "'", `'\''`) + "'"
}

// mib is bytes as MiB.
func mib(b int64) string {
	if b <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.1f", float64(b)/(1<<20))
}

// tables are the answer's tables as cells: the finalists, the gate's
// unavailable rows, the SM search.
func (a *Answer) finalCells() [][]string {
	rows := [][]string{{"rank", "dispatcher", "step_p50_ms", "samples", "vs_winner_%", "correctness", "mem_per_rank_MiB", "SMs_left_for_compute"}}
	w := winnerP50(a)
	rank := 0
	for _, f := range ranked(a.Finalists, a.Decision) {
		if f.Status == results.StatusUnavailable { // the gate's table says why
			continue
		}
		r, p50, vs := "—", "—", "—"
		if f.Status == results.StatusOK && len(f.Samples) > 0 {
			rank++
			r = fmt.Sprint(rank)
			p50 = fmt.Sprintf("%.3f", f.P50)
			if w > 0 {
				vs = fmt.Sprintf("%+.1f", 100*(f.P50/w-1))
			}
		}
		corr := f.Correct
		if f.Status != results.StatusOK {
			corr = results.StatusLine(f.Status, f.Dispatcher, f.Impl, f.Reason)
		}
		rows = append(rows, []string{r, f.Label(), p50, fmt.Sprint(len(f.Samples)), vs, corr, mib(f.MemPerRank), f.SMsLeft})
	}
	return rows
}

// ranked is the finalists that ran, the decision's winner and runner-up
// first, the others by their median, then those that did not run.
func ranked(fs []*Final, d Decision) []*Final {
	key := func(f *Final) (int, float64) {
		switch f.Label() {
		case d.Winner:
			return 0, 0
		case d.RunnerUp:
			return 1, 0
		}
		return 2, f.P50
	}
	var ok, rest []*Final
	for _, f := range fs {
		if f.Status == results.StatusOK && len(f.Samples) > 0 {
			ok = append(ok, f)
		} else {
			rest = append(rest, f)
		}
	}
	sort.SliceStable(ok, func(i, j int) bool {
		ki, pi := key(ok[i])
		kj, pj := key(ok[j])
		return ki < kj || ki == kj && pi < pj
	})
	return append(ok, rest...)
}

func (a *Answer) gateCells() [][]string {
	rows := [][]string{{"dispatcher", "impl", "found", "why"}}
	for _, g := range a.Gate {
		if !g.Available {
			rows = append(rows, []string{g.Dispatcher, g.Impl, g.Stage, g.Reason})
		}
	}
	return rows
}

func (a *Answer) tuningCells() [][]string {
	rows := [][]string{{"dispatcher", "bench dispatch: sms → dispatch+combine p50 ms", "full step p50 ms at the best two", "best", "smallest within 2%"}}
	for _, t := range a.Tuning {
		var pts, conf []string
		for _, p := range t.Points {
			pts = append(pts, smPoint(p))
		}
		for _, p := range t.Confirmed {
			conf = append(conf, smPoint(p))
		}
		rows = append(rows, []string{t.Dispatcher + "/" + t.Impl, strings.Join(pts, ", "), strings.Join(conf, ", "), fmt.Sprint(t.Best), fmt.Sprint(t.Smallest)})
	}
	return rows
}

func smPoint(p SMPoint) string {
	if p.Status != results.StatusOK {
		return fmt.Sprintf("%d → %s", p.SMs, p.Status)
	}
	return fmt.Sprintf("%d → %.3f", p.SMs, p.Ms)
}

// header lines: the question and how it was measured.
func (a *Answer) header() []string {
	h := []string{
		fmt.Sprintf("question: which dispatcher, and how many SMs, for %s at EP %s%s on this node?", a.Preset, epOf(a.Workload), inPrecision(a.Precision)),
		"workload: " + a.Workload,
		fmt.Sprintf("device: %s · %s", a.Device, a.Stack),
		fmt.Sprintf("measured in %.0f s of a %.0f s budget: %d round(s) of the finalists' training steps, interleaved", a.ElapsedS, a.BudgetS, a.Rounds),
	}
	if a.Scaled != "" {
		h = append(h, "scaled: "+a.Scaled)
	}
	if a.Stopped != "" {
		h = append(h, "stopped early: "+a.Stopped)
	}
	return h
}

// inPrecision is " in fp8" (the precision when not bf16), or "".
func inPrecision(p string) string {
	if p == "" {
		return ""
	}
	return " in " + p
}

func epOf(workload string) string {
	for _, f := range strings.Fields(workload) {
		if v, ok := strings.CutPrefix(f, "ep="); ok {
			return v
		}
	}
	return "?"
}

// Write prints the answer in format (Formats); records are what it
// measured, which the markdown and html answers show as report's tables.
func Write(w io.Writer, a *Answer, format string, records []results.Record) error {
	switch format {
	case "text":
		return writeText(w, a)
	case "markdown":
		return writeMarkdown(w, a, records)
	case "html":
		return writeHTML(w, a, records)
	case "json":
		b, err := json.MarshalIndent(a, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	return fmt.Errorf("unknown format %q (allowed: %s)", format, strings.Join(Formats, ", "))
}

// errWriter keeps the first write error.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) f(format string, args ...any) {
	if e.err == nil {
		_, e.err = fmt.Fprintf(e.w, format, args...)
	}
}

func writeText(w io.Writer, a *Answer) error {
	p := &errWriter{w: w}
	host := a.Device == "host"
	if host {
		p.f("# %s\n", HostWarning)
	}
	p.f("# moebench advise\n")
	for _, h := range a.header() {
		p.f("#   %s\n", h)
	}
	p.f("\nANSWER: %s\n", a.Decision.Summary)
	if a.Reproduce != "" {
		p.f("reproduce the winner: %s\n", a.Reproduce)
	}
	p.f("\nthe guide (%s) for %s", GuideSource, a.Guide.Hardware)
	if a.Guide.Model != "" {
		p.f("; %s", a.Guide.Model)
	}
	p.f(":\n  %s\n  %s\n", a.Guide.Advice, a.Guide.Agreement)
	p.f("\nfinalists (training steps, pooled over the rounds):\n")
	if p.err == nil {
		p.err = results.WriteAligned(w, a.finalCells(), 2)
	}
	if len(a.Tuning) > 0 {
		p.f("\nSM budgets (coarse to fine with bench dispatch, then the full step):\n")
		if p.err == nil {
			p.err = results.WriteAligned(w, a.tuningCells(), 3)
		}
	}
	if g := a.gateCells(); len(g) > 1 {
		p.f("\nunavailable here (an environment limitation, never a timing):\n")
		if p.err == nil {
			p.err = results.WriteAligned(w, g, 4)
		}
	}
	for _, n := range a.Notes {
		p.f("# %s\n", n)
	}
	if host {
		p.f("# %s\n", HostWarning)
	}
	return p.err
}

func writeMarkdown(w io.Writer, a *Answer, records []results.Record) error {
	p := &errWriter{w: w}
	host := a.Device == "host"
	if host {
		p.f("> **%s**\n\n", HostWarning)
	}
	p.f("# moebench advise: %s at EP %s%s\n\n", a.Preset, epOf(a.Workload), inPrecision(a.Precision))
	for _, h := range a.header() {
		p.f("- %s\n", mdEscape(h))
	}
	p.f("\n## Answer\n\n**%s**\n\n", mdEscape(a.Decision.Summary))
	if a.Reproduce != "" {
		p.f("Reproduce the winner:\n\n```\n%s\n```\n\n", a.Reproduce)
	}
	p.f("## The guide beside the measurement\n\n%s for %s", GuideSource, mdEscape(a.Guide.Hardware))
	if a.Guide.Model != "" {
		p.f("; %s", mdEscape(a.Guide.Model))
	}
	p.f(": %s.\n\n%s\n\n## Finalists\n\n", mdEscape(a.Guide.Advice), mdEscape(a.Guide.Agreement))
	if p.err == nil {
		p.err = results.WriteMarkdownTable(w, a.finalCells(), 2)
	}
	if len(a.Tuning) > 0 {
		p.f("\n## SM budgets\n\n")
		if p.err == nil {
			p.err = results.WriteMarkdownTable(w, a.tuningCells(), 3)
		}
	}
	if g := a.gateCells(); len(g) > 1 {
		p.f("\n## Unavailable here\n\n")
		if p.err == nil {
			p.err = results.WriteMarkdownTable(w, g, 4)
		}
	}
	if len(a.Notes) > 0 {
		p.f("\n")
		for _, n := range a.Notes {
			p.f("- %s\n", mdEscape(n))
		}
	}
	if len(records) > 0 && p.err == nil {
		p.f("\n")
		p.err = results.WriteReport(w, results.BuildReport(records), "markdown", "Evidence: the records advise measured (moebench report)")
	}
	if host {
		p.f("\n> **%s**\n", HostWarning)
	}
	return p.err
}

func mdEscape(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

var answerPage = template.Must(template.New("advise").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>moebench advise: {{.A.Preset}}</title>
<style>
body{font-family:system-ui,sans-serif;margin:1em 1.2em;line-height:1.35;color:#222}
table{border-collapse:collapse;font-size:85%}
th,td{border:1px solid #bbb;padding:.15em .35em}
th{background:#f3f3f3}
.answer{font-size:1.1em;background:#eef6ee;border-left:4px solid #3a3;padding:.4em .7em}
.caveat{background:#fff4d6;border-left:4px solid #e0a800;padding:.4em .7em}
code{background:#f3f3f3;padding:.1em .3em}
</style></head><body>
{{if .Host}}<p class="caveat">{{.Warning}}</p>{{end}}
<h1>moebench advise: {{.A.Preset}}</h1>
<ul>{{range .Header}}<li>{{.}}</li>{{end}}</ul>
<p class="answer">{{.A.Decision.Summary}}</p>
{{with .A.Reproduce}}<p>Reproduce the winner: <code>{{.}}</code></p>{{end}}
<h2>The guide beside the measurement</h2>
<p>{{.Source}} for {{.A.Guide.Hardware}}{{with .A.Guide.Model}}; {{.}}{{end}}: {{.A.Guide.Advice}}.</p>
<p>{{.A.Guide.Agreement}}</p>
{{range .Tables}}<h2>{{.Title}}</h2>
<table>{{range $i, $r := .Rows}}<tr>{{range $r}}{{if $i}}<td>{{.}}</td>{{else}}<th>{{.}}</th>{{end}}{{end}}</tr>
{{end}}</table>
{{end}}
{{with .A.Notes}}<ul>{{range .}}<li>{{.}}</li>{{end}}</ul>{{end}}
{{if .Report}}<h2>Evidence</h2><p>The records advise measured, as <code>moebench report --format html</code> shows them: <a href="{{.Report}}">{{.Report}}</a>.</p>{{end}}
{{if .Host}}<p class="caveat">{{.Warning}}</p>{{end}}
</body></html>
`))

// ReportFile is the file name of the evidence page an html answer links
// (written beside it by the command).
const ReportFile = "report.html"

func writeHTML(w io.Writer, a *Answer, records []results.Record) error {
	type table struct {
		Title string
		Rows  [][]string
	}
	tables := []table{{"Finalists (training steps, pooled over the rounds)", a.finalCells()}}
	if len(a.Tuning) > 0 {
		tables = append(tables, table{"SM budgets", a.tuningCells()})
	}
	if g := a.gateCells(); len(g) > 1 {
		tables = append(tables, table{"Unavailable here", g})
	}
	report := ""
	if len(records) > 0 {
		report = ReportFile
	}
	return answerPage.Execute(w, map[string]any{"A": a, "Host": a.Device == "host", "Warning": HostWarning, "Header": a.header(),
		"Source": GuideSource, "Tables": tables, "Report": report})
}
