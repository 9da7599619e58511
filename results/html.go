package results

import (
	"html/template"
	"io"
	"strings"
)

// The HTML report: one self-contained page (no script, no external file)
// with each group's tables, in containers that scroll sideways where a
// table is wider than the window, and its charts as inline SVG (charts.go).

var page = template.Must(template.New("report").Funcs(template.FuncMap{"breakable": breakable}).Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Title}}</title>
<style>
body{font-family:system-ui,sans-serif;margin:1em 1.2em;line-height:1.35;color:#222}
h1{font-size:1.4em}
h2{font-size:1.15em;margin-top:2.2em;border-top:1px solid #ccc;padding-top:.8em}
h3{font-size:1em;margin:1.2em 0 .3em}
.scroll{overflow-x:auto;max-width:100%;margin:.6em 0}
table{border-collapse:collapse;font-size:80%}
th,td{border:1px solid #bbb;padding:.15em .35em}
th{background:#f3f3f3;font-weight:600;font-size:95%;vertical-align:bottom;text-align:center}
td{white-space:nowrap}
table.rebalance td:first-child{white-space:normal;min-width:12em}
td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.unavailable td,tr.failed td{color:#777;font-style:italic}
.caveat{background:#fff4d6;border-left:4px solid #e0a800;padding:.4em .7em}
.key{font-size:90%;color:#333}
.key li{margin:.2em 0}
ul.notes{font-size:90%;color:#444}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(30em,1fr));gap:1em 1.5em;margin-top:1em}
figure{margin:0}
figure svg{width:100%;height:auto;display:block}
figcaption{font-size:85%;color:#444;margin-top:.2em}
</style></head><body>
<h1>{{.Title}}</h1>
<ul>{{range .Stacks}}<li>stack #{{.StackNo}}: {{.Stack.Summary}}</li>{{end}}</ul>
<details class="key" open><summary>How to read the tables</summary><ul>{{range .Key}}<li>{{.}}</li>{{end}}</ul></details>
{{range .Groups}}<section class="group">
<h2>{{.Title}}</h2>
{{with .Caveat}}<p class="caveat">{{.}}</p>{{end}}
<div class="scroll"><table class="points">
<tr>{{range .Heads}}<th>{{breakable .}}</th>{{end}}</tr>
{{range .Rows}}<tr class="{{.Status}}">{{range $i, $c := .Cells}}<td{{if ge $i $.Left}} class="num"{{end}}>{{$c}}</td>{{end}}</tr>
{{end}}</table></div>
{{with .Rebalance}}<h3>Rebalancing (measured GEMM straggler: before = the same steps with phase 2 paused)</h3>
<div class="scroll"><table class="rebalance">
<tr>{{range index . 0}}<th>{{breakable .}}</th>{{end}}</tr>
{{range $i, $r := .}}{{if $i}}<tr>{{range $j, $c := $r}}<td{{if $j}} class="num"{{end}}>{{$c}}</td>{{end}}</tr>
{{end}}{{end}}</table></div>
{{end}}{{with .Notes}}<ul class="notes">{{range .}}<li>{{.}}</li>{{end}}</ul>{{end}}
<div class="charts">{{range .Charts}}<figure class="chart" data-chart="{{.Kind}}">{{.SVG}}<figcaption>{{.Caption}}</figcaption></figure>
{{end}}</div>
</section>
{{end}}</body></html>
`))

type htmlRow struct {
	Status string
	Cells  []string
}

type htmlGroup struct {
	Title     string
	Caveat    string
	Heads     []string
	Rows      []htmlRow
	Rebalance [][]string
	Notes     []string
	Charts    []chart
}

// hostCaveat heads a host group's tables.
const hostCaveat = "Host device: these times are the wall clock of Go code running every rank on the CPU, one after another. " +
	"They show the pipeline, not performance, and the speedups (" + hostMark + ") say nothing about the dispatchers on a GPU."

// breakable lets a header wrap after its underscores.
func breakable(s string) template.HTML {
	return template.HTML(strings.ReplaceAll(template.HTMLEscapeString(s), "_", "_<wbr>"))
}

// reportHTML writes a self-contained page: per group the tables and SVG
// charts (charts.go). Unavailable and failed rows appear in the tables only.
func reportHTML(w io.Writer, groups []Group, title string) error {
	data := struct {
		Title  string
		Stacks []Group
		Key    []string
		Left   int // text columns
		Groups []htmlGroup
	}{Title: title, Stacks: stacks(groups), Key: reportKey(groups), Left: textColumns}
	colors := phaseColors(phaseUnion(allRows(groups)))
	for _, g := range groups {
		hg := htmlGroup{Title: g.Title(), Notes: g.notes(), Rebalance: g.rebalanceCells()}
		if g.Workload.Device == "host" {
			hg.Caveat = hostCaveat
		}
		cells := g.cells()
		hg.Heads = cells[0]
		for i, r := range g.Rows {
			hg.Rows = append(hg.Rows, htmlRow{Status: r.Rec.Status, Cells: cells[i+1]})
		}
		charts, err := groupCharts(g, colors)
		if err != nil {
			return err
		}
		hg.Charts = charts
		data.Groups = append(data.Groups, hg)
	}
	return page.Execute(w, data)
}
