package results

import (
	"bytes"
	"fmt"
	"html/template"
	"io"
	"sort"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

var page = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{{.Title}}</title>
<style>
body{font-family:system-ui,sans-serif;margin:2em;max-width:80em}
table{border-collapse:collapse;font-size:90%;margin:1em 0}
th,td{border:1px solid #bbb;padding:.25em .5em}
td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.unavailable td,tr.failed td{color:#777;font-style:italic}
.charts svg{max-width:100%;height:auto;margin-right:1em}
</style></head><body>
<h1>{{.Title}}</h1>
<ul>{{range .Stacks}}<li>stack #{{.StackNo}}: {{.Stack.Summary}}</li>{{end}}</ul>
{{range .Groups}}
<h2>{{.Title}}</h2>
<table><tr>{{range $.Heads}}<th>{{.}}</th>{{end}}</tr>
{{range .Rows}}<tr class="{{.Status}}">{{range $i, $c := .Cells}}<td{{if ge $i $.Left}} class="num"{{end}}>{{$c}}</td>{{end}}</tr>
{{end}}</table>
{{with .Notes}}<ul>{{range .}}<li>{{.}}</li>{{end}}</ul>{{end}}
<div class="charts">{{range .Charts}}{{.}}{{end}}</div>
{{end}}
</body></html>
`))

type htmlRow struct {
	Status string
	Cells  []string
}

type htmlGroup struct {
	Title  string
	Rows   []htmlRow
	Notes  []string
	Charts []template.HTML
}

// reportHTML writes a self-contained page: the tables plus, per group, SVG
// charts of the step time per row, the time against --sms, and the per-phase
// breakdown. Unavailable and failed rows appear in the tables only.
func reportHTML(w io.Writer, groups []Group, title string) error {
	data := struct {
		Title  string
		Stacks []Group
		Heads  []string
		Left   int
		Groups []htmlGroup
	}{Title: title, Stacks: stacks(groups), Left: textColumns}
	for _, g := range groups {
		hg := htmlGroup{Title: g.Title(), Notes: g.notes()}
		cells := g.cells()
		data.Heads = cells[0]
		for i, r := range g.Rows {
			hg.Rows = append(hg.Rows, htmlRow{Status: r.Rec.Status, Cells: cells[i+1]})
		}
		charts, err := groupCharts(g)
		if err != nil {
			return err
		}
		hg.Charts = charts
		data.Groups = append(data.Groups, hg)
	}
	return page.Execute(w, data)
}

func okRows(g Group) []Row {
	var out []Row
	for _, r := range g.Rows {
		if r.Rec.Status == StatusOK {
			out = append(out, r)
		}
	}
	return out
}

func rowLabel(r Row) string {
	c := r.Rec.Config
	l := c.Dispatcher
	if c.Impl != "native" {
		l += "/" + c.Impl
	}
	if c.SMs > 0 {
		l += fmt.Sprintf(" %dSM", c.SMs)
	}
	return safeLabel(l)
}

// safeLabel keeps chart text to letters, digits and a few marks: labels come
// from record files, and the SVG is inlined into the page.
func safeLabel(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', strings.ContainsRune("/_.:- ", r):
			return r
		}
		return '?'
	}, s)
}

// groupCharts renders the group's charts as inline SVG.
func groupCharts(g Group) ([]template.HTML, error) {
	rows := okRows(g)
	if len(rows) == 0 {
		return nil, nil
	}
	var out []template.HTML
	add := func(p *plot.Plot, err error) error {
		if err != nil || p == nil {
			return err
		}
		s, err := svg(p)
		out = append(out, s)
		return err
	}
	if err := add(stepChart(rows)); err != nil {
		return nil, err
	}
	if err := add(smsChart(rows)); err != nil {
		return nil, err
	}
	if err := add(phaseChart(rows)); err != nil {
		return nil, err
	}
	return out, nil
}

func stepChart(rows []Row) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "step time per dispatcher (p50)"
	p.Y.Label.Text = "ms"
	vals := make(plotter.Values, len(rows))
	names := make([]string, len(rows))
	for i, r := range rows {
		vals[i], names[i] = r.Rec.Timing.Step.P50, rowLabel(r)
	}
	b, err := plotter.NewBarChart(vals, vg.Points(24))
	if err != nil {
		return nil, err
	}
	b.Color = plotutil.Color(0)
	p.Add(b)
	nominal(p, names)
	return p, nil
}

// nominal labels the x axis with names and pads it so no label is clipped;
// the y axis starts at zero.
func nominal(p *plot.Plot, names []string) {
	p.NominalX(names...)
	p.X.Min, p.X.Max = -0.6, float64(len(names))-0.4
	p.Y.Min = 0
	p.Legend.Top, p.Legend.Left = true, true
}

// smsChart plots step time against --sms for dispatchers measured at two or
// more SM budgets; nil when none was.
func smsChart(rows []Row) (*plot.Plot, error) {
	by := map[string]plotter.XYs{}
	for _, r := range rows {
		c := r.Rec.Config
		if c.SMs > 0 {
			k := safeLabel(c.Dispatcher + "/" + c.Impl)
			by[k] = append(by[k], plotter.XY{X: float64(c.SMs), Y: r.Rec.Timing.Step.P50})
		}
	}
	var args []any
	names := make([]string, 0, len(by))
	for k, xy := range by {
		if len(xy) >= 2 {
			names = append(names, k)
		}
	}
	if len(names) == 0 {
		return nil, nil
	}
	sort.Strings(names)
	for _, k := range names {
		xy := by[k]
		sort.Slice(xy, func(a, b int) bool { return xy[a].X < xy[b].X })
		args = append(args, k, xy)
	}
	p := plot.New()
	p.Title.Text = "step time vs --sms (p50)"
	p.X.Label.Text = "SMs"
	p.Y.Label.Text = "ms"
	if err := plotutil.AddLinePoints(p, args...); err != nil {
		return nil, err
	}
	p.Y.Min, p.Y.Max = 0, 1.3*p.Y.Max // headroom for the legend
	p.X.Min, p.X.Max = p.X.Min-1, p.X.Max+1
	p.Legend.Top, p.Legend.Left = true, true
	return p, nil
}

func phaseChart(rows []Row) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "per-phase time (p50, slowest rank)"
	p.Y.Label.Text = "ms"
	var phases []string
	for _, ph := range rows[0].Rec.Timing.Phases {
		phases = append(phases, ph.Name)
	}
	var below *plotter.BarChart
	for i, name := range phases {
		vals := make(plotter.Values, len(rows))
		for j, r := range rows {
			vals[j] = phaseP50(r.Rec, name)
		}
		b, err := plotter.NewBarChart(vals, vg.Points(24))
		if err != nil {
			return nil, err
		}
		b.Color = plotutil.Color(i)
		b.LineStyle.Width = 0
		if below != nil {
			b.StackOn(below)
		}
		below = b
		p.Add(b)
		p.Legend.Add(safeLabel(name), b)
	}
	names := make([]string, len(rows))
	for i, r := range rows {
		names[i] = rowLabel(r)
	}
	nominal(p, names)
	p.Y.Max *= 1.3 // headroom for the legend
	return p, nil
}

// svg renders p as an SVG element for inline use (no XML declaration).
func svg(p *plot.Plot) (template.HTML, error) {
	wt, err := p.WriterTo(6*vg.Inch, 3.5*vg.Inch, "svg")
	if err != nil {
		return "", err
	}
	var b bytes.Buffer
	if _, err := wt.WriteTo(&b); err != nil {
		return "", err
	}
	s := b.String()
	if i := strings.Index(s, "<svg"); i >= 0 {
		s = s[i:]
	}
	return template.HTML(s), nil // produced by gonum/plot from our numbers and escaped labels
}
