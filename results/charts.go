package results

import (
	"bytes"
	"fmt"
	"html/template"
	"image/color"
	"math"
	"sort"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// The HTML report's charts (gonum/plot, inline SVG), per group: the two
// steps per row and the phases stacked, dispatch and combine per row, and
// for SM-driven dispatchers the step and the GB/s per SM against the SM
// budget. Whiskers span p10–p90 of the per-iteration samples. Each legend
// sits to the right of its plot, so that it covers no data.

// chart is one rendered chart.
type chart struct {
	Kind    string // step, phases, transfer, sms, gbps_per_sm
	SVG     template.HTML
	Caption string
}

// palette: qualitative colours, distinct enough for a dozen phases.
var palette = []color.Color{
	rgb(0x4e79a7), rgb(0xf28e2b), rgb(0x59a14f), rgb(0xe15759), rgb(0x76b7b2), rgb(0xedc948),
	rgb(0xb07aa1), rgb(0xff9da7), rgb(0x9c755f), rgb(0xbab0ac), rgb(0x1f3a93), rgb(0x8cd17d),
}

func rgb(v uint32) color.Color { return color.RGBA{uint8(v >> 16), uint8(v >> 8), uint8(v), 255} }

func colorOf(i int) color.Color { return palette[i%len(palette)] }

// phaseColors gives each phase of the page one colour, in pipeline order.
func phaseColors(phases []string) map[string]color.Color {
	m := map[string]color.Color{}
	for i, p := range phases {
		m[p] = colorOf(i)
	}
	return m
}

func okRows(g Group) []Row {
	var out []Row
	for _, r := range g.Rows {
		if r.Rec.Status == StatusOK && r.Rec.Timing != nil {
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
	if b := smBudget(r.Rec); b > 0 {
		l += fmt.Sprintf(" %dSM", b)
	}
	return safeLabel(l)
}

// safeLabel keeps chart text to letters, digits and a few marks: labels come
// from record files, and the SVG is inlined into the page.
func safeLabel(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', strings.ContainsRune("/_.:-+ ", r):
			return r
		}
		return '?'
	}, s)
}

// groupCharts renders the group's charts; colors are the page's phase colours.
func groupCharts(g Group, colors map[string]color.Color) ([]chart, error) {
	rows := okRows(g)
	if len(rows) == 0 {
		return nil, nil
	}
	var out []chart
	for _, mk := range []func([]Row, map[string]color.Color) (*chart, error){stepChart, phaseChart, transferChart, smsChart, perSMChart} {
		c, err := mk(rows, colors)
		if err != nil {
			return nil, err
		}
		if c != nil {
			out = append(out, *c)
		}
	}
	return out, nil
}

// spread is the p50 of samples (or p50 where there are none) with the
// distances down to p10 and up to p90.
func spread(p50 float64, samples []float64) (mid, low, high float64) {
	lo, ok1 := percentile(samples, 10)
	hi, ok2 := percentile(samples, 90)
	if !ok1 || !ok2 {
		return p50, 0, 0
	}
	return p50, max(0, p50-lo), max(0, hi-p50)
}

// whisker is one bar's value with its p10–p90 spread, in the chart's unit.
type whisker struct{ x, y, low, high float64 }

// errBars are the whiskers ws as a plotter.
type errBars []whisker

func (e errBars) Len() int                        { return len(e) }
func (e errBars) XY(i int) (float64, float64)     { return e[i].x, e[i].y }
func (e errBars) YError(i int) (float64, float64) { return e[i].low, e[i].high }

// unitOf is the y unit for times vals (ms): ms, or µs when one would print
// as 0.0xx ms; and the factor from ms.
func unitOf(vals []float64) (string, float64) {
	if microseconds(vals) {
		return "µs", 1e3
	}
	return "ms", 1
}

// barWidth is the width of one of per bars around each of n x positions in
// a chart w wide.
func barWidth(w vg.Length, n, per int) vg.Length {
	unit := 0.75 * w / vg.Length(float64(n)+0.2)
	return min(vg.Points(26), 0.7*unit/vg.Length(per))
}

// series is one set of bars of a grouped bar chart.
type series struct {
	name string
	ws   []whisker // x is the row index; the y of a missing bar is 0, without whisker
}

// groupedBars draws the series side by side at each x position, with
// whiskers.
func groupedBars(p *plot.Plot, leg *legend, ss []series, colors []color.Color, w vg.Length, n int) error {
	bw := barWidth(w, n, len(ss))
	for k, s := range ss {
		vals := make(plotter.Values, len(s.ws))
		var eb errBars
		shift := (float64(k) - float64(len(ss)-1)/2) * 0.8 / float64(max(len(ss), 2))
		for i, wk := range s.ws {
			vals[i] = wk.y
			if wk.y > 0 && wk.low+wk.high > 0 {
				eb = append(eb, whisker{x: float64(i) + shift, y: wk.y, low: wk.low, high: wk.high})
			}
		}
		b, err := plotter.NewBarChart(vals, bw)
		if err != nil {
			return err
		}
		b.XMin = shift
		b.Color = colors[k]
		b.LineStyle.Width = 0
		p.Add(b)
		leg.add(s.name, b)
		if len(eb) > 0 {
			e, err := plotter.NewYErrorBars(eb)
			if err != nil {
				return err
			}
			e.LineStyle.Width = vg.Points(1)
			e.CapWidth = min(bw, vg.Points(8))
			p.Add(e)
		}
	}
	return nil
}

// barSeries are one series per name: each row's bar is the p50 of the
// phase pick gives for the series (nil: no bar) with its p10–p90 whisker,
// in the chart's unit (f per ms).
func barSeries(rows []Row, names []string, f float64, pick func(r *Record, series int) *Phase) []series {
	ss := make([]series, len(names))
	for k, n := range names {
		ss[k].name = n
		for i, r := range rows {
			var wk whisker
			if ph := pick(r.Rec, k); ph != nil {
				mid, lo, hi := spread(ph.P50, ph.Samples)
				wk = whisker{x: float64(i), y: f * mid, low: f * lo, high: f * hi}
			}
			ss[k].ws = append(ss[k].ws, wk)
		}
	}
	return ss
}

// barChart draws the series as bars side by side per row, in colors.
func barChart(title, unit string, rows []Row, ss []series, colors ...color.Color) (template.HTML, error) {
	p := newPlot(title, unit)
	leg := newLegend()
	if err := groupedBars(p, leg, ss, colors, chartW, len(rows)); err != nil {
		return "", err
	}
	nominal(p, rowNames(rows))
	return render(p, leg)
}

const chartW, chartH = 6.2 * vg.Inch, 3.6 * vg.Inch

// sans is the charts' typeface, as the page's text.
const sans = "Sans"

// newPlot is a plot with the chart's fonts and title.
func newPlot(title, ylabel string) *plot.Plot {
	p := plot.New()
	for _, f := range []*font.Font{&p.Title.TextStyle.Font, &p.X.Label.TextStyle.Font, &p.Y.Label.TextStyle.Font, &p.X.Tick.Label.Font, &p.Y.Tick.Label.Font} {
		f.Variant = sans
	}
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(11)
	p.Y.Label.Text = ylabel
	p.Y.Min = 0
	p.Y.Tick.Marker = plot.TickerFunc(niceTicks)
	return p
}

// niceTicks labels about five round values (1, 2 or 5 × a power of ten
// apart) between lo and hi, with as many decimals as the step needs, and
// marks the halves between them.
func niceTicks(lo, hi float64) []plot.Tick {
	if !(hi > lo) {
		return []plot.Tick{{Value: lo, Label: strconv.FormatFloat(lo, 'g', 3, 64)}}
	}
	raw := (hi - lo) / 5
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{2, 5, 10} {
		if step < raw {
			step = m * mag
		}
	}
	dec := max(0, -int(math.Floor(math.Log10(step))))
	var ticks []plot.Tick
	for v := math.Ceil(lo/step) * step; v <= hi+step*1e-9; v += step {
		ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', dec, 64)})
		if h := v + step/2; h <= hi {
			ticks = append(ticks, plot.Tick{Value: h})
		}
	}
	return ticks
}

// nominal labels the x axis with the rows' names (slanted when there are
// many) and pads it so no bar is clipped.
func nominal(p *plot.Plot, names []string) {
	p.NominalX(names...)
	p.X.Min, p.X.Max = -0.6, float64(len(names))-0.4
	if len(names) > 3 {
		p.X.Tick.Label.Rotation = math.Pi / 7
		p.X.Tick.Label.XAlign = draw.XRight
		p.X.Tick.Label.YAlign = draw.YCenter
	}
}

func rowNames(rows []Row) []string {
	names := make([]string, len(rows))
	for i, r := range rows {
		names[i] = rowLabel(r)
	}
	return names
}

// stepChart: per row, the slowest rank's step and the lockstep bound.
func stepChart(rows []Row, _ map[string]color.Color) (*chart, error) {
	var all []float64
	for _, r := range rows {
		all = append(all, r.Rec.Timing.Step.P50)
	}
	unit, f := unitOf(all)
	ss := barSeries(rows, []string{"slowest rank's step", "lockstep bound"}, f, func(r *Record, k int) *Phase {
		s, l := twoSteps(r)
		return []*Phase{s, l}[k]
	})
	svg, err := barChart("step time per row (p50, whiskers p10–p90)", unit, rows, ss, colorOf(0), colorOf(1))
	basis := "the host device's step (speedup, compare) is the lockstep bound"
	if stepIs(rows[0].Rec) == StepSlowestRank {
		basis = "a GPU's step (speedup, compare) is the slowest rank's"
	}
	return &chart{Kind: "step", SVG: svg, Caption: "Slowest rank's own step and the lockstep bound (each phase's slowest rank summed) per row; " + basis + "."}, err
}

// phaseChart: per row, every phase's p50 stacked, in pipeline order, with
// the phases of every row in the legend.
func phaseChart(rows []Row, colors map[string]color.Color) (*chart, error) {
	phases := phaseUnion(rows)
	var all []float64
	for _, r := range rows {
		for _, ph := range r.Rec.Timing.Phases {
			all = append(all, ph.P50)
		}
	}
	unit, f := unitOf(all)
	p := newPlot("per-phase time (p50 of each phase's slowest rank), stacked", unit)
	leg := newLegend()
	bw := barWidth(chartW, len(rows), 1) * 1.4
	var below *plotter.BarChart
	for _, name := range phases {
		vals := make(plotter.Values, len(rows))
		for j, r := range rows {
			vals[j] = f * phaseP50(r.Rec, name)
		}
		b, err := plotter.NewBarChart(vals, bw)
		if err != nil {
			return nil, err
		}
		b.Color = colors[name]
		b.LineStyle.Width = 0
		if below != nil {
			b.StackOn(below)
		}
		below = b
		p.Add(b)
		leg.add(safeLabel(name), b)
	}
	leg.reverse() // top of the stack first
	nominal(p, rowNames(rows))
	svg, err := render(p, leg)
	return &chart{Kind: "phases", SVG: svg, Caption: "Each phase's p50 (its slowest rank per iteration), stacked: about the lockstep bound. Phases: " + strings.Join(phases, ", ") + "."}, err
}

// transferChart: per row, the dispatch and combine phases with whiskers.
func transferChart(rows []Row, _ map[string]color.Color) (*chart, error) {
	names := []string{"dispatch", "combine"}
	var all []float64
	for _, r := range rows {
		for _, n := range names {
			if ph := phaseOf(r.Rec, n); ph != nil {
				all = append(all, ph.P50)
			}
		}
	}
	if len(all) == 0 {
		return nil, nil
	}
	unit, f := unitOf(all)
	ss := barSeries(rows, names, f, func(r *Record, k int) *Phase { return phaseOf(r, names[k]) })
	svg, err := barChart("dispatch and combine (p50, whiskers p10–p90)", unit, rows, ss, colorOf(2), colorOf(3))
	return &chart{Kind: "transfer", SVG: svg, Caption: "The dispatcher's own phases: dispatch and combine, each its slowest rank per iteration."}, err
}

// budgets groups the rows of SM-driven dispatchers by dispatcher/impl,
// sorted by SM budget; nil when no dispatcher ran at two budgets or more.
func budgets(rows []Row) (names []string, by map[string][]Row) {
	by = map[string][]Row{}
	for _, r := range rows {
		if smBudget(r.Rec) > 0 {
			k := safeLabel(r.Rec.Config.Dispatcher + "/" + r.Rec.Config.Impl)
			by[k] = append(by[k], r)
		}
	}
	for k, rs := range by {
		sort.SliceStable(rs, func(a, b int) bool { return smBudget(rs[a].Rec) < smBudget(rs[b].Rec) })
		if len(rs) >= 2 {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	return names, by
}

// smsChart: step time against the SM budget per SM-driven dispatcher, with
// the other rows' steps as dashed lines; nil unless a dispatcher ran at two
// budgets or more.
func smsChart(rows []Row, _ map[string]color.Color) (*chart, error) {
	names, by := budgets(rows)
	if len(names) == 0 {
		return nil, nil
	}
	var all []float64
	for _, r := range rows {
		all = append(all, r.Rec.Timing.Step.P50)
	}
	unit, f := unitOf(all)
	p := newPlot("step time vs SM budget (p50, whiskers p10–p90)", unit)
	p.X.Label.Text = "SMs"
	leg := newLegend()
	lo, hi := math.Inf(1), math.Inf(-1)
	for i, k := range names {
		var xy plotter.XYs
		var eb errBars
		for _, r := range by[k] {
			x := float64(smBudget(r.Rec))
			lo, hi = min(lo, x), max(hi, x)
			mid, l, h := spread(r.Rec.Timing.Step.P50, r.Rec.Timing.Step.Samples)
			xy = append(xy, plotter.XY{X: x, Y: f * mid})
			eb = append(eb, whisker{x: x, y: f * mid, low: f * l, high: f * h})
		}
		if err := addLine(p, leg, k, xy, eb, colorOf(i), false); err != nil {
			return nil, err
		}
	}
	for i, r := range rows { // the others as references
		if smBudget(r.Rec) > 0 {
			continue
		}
		y := f * r.Rec.Timing.Step.P50
		xy := plotter.XYs{{X: lo, Y: y}, {X: hi, Y: y}}
		if err := addLine(p, leg, rowLabel(r), xy, nil, colorOf(len(names)+i), true); err != nil {
			return nil, err
		}
	}
	pad := max(1, (hi-lo)*0.08)
	p.X.Min, p.X.Max = lo-pad, hi+pad
	svg, err := render(p, leg)
	return &chart{Kind: "sms", SVG: svg, Caption: "Step time (the record's step) per SM budget of each SM-driven dispatcher; dashed: the rows without an SM budget."}, err
}

// perSMChart: dispatch and combine GB/s per SM (the design's convention)
// against the SM budget; nil when no row has them.
func perSMChart(rows []Row, _ map[string]color.Color) (*chart, error) {
	var sm []Row
	for _, r := range rows {
		if r.Rec.Traffic != nil && smBudget(r.Rec) > 0 && (r.Rec.Traffic.DispatchGBpsPerSM > 0 || r.Rec.Traffic.CombineGBpsPerSM > 0) {
			sm = append(sm, r)
		}
	}
	if len(sm) == 0 {
		return nil, nil
	}
	_, by := budgets(sm)
	var keys []string
	for k := range by {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	p := newPlot("GB/s per SM vs SM budget (algo convention, whiskers p10–p90)", "GB/s per SM")
	p.X.Label.Text = "SMs"
	leg := newLegend()
	lo, hi := math.Inf(1), math.Inf(-1)
	n := 0
	for _, k := range keys {
		for _, phase := range []string{"dispatch", "combine"} {
			var xy plotter.XYs
			var eb errBars
			for _, r := range by[k] {
				ph := phaseOf(r.Rec, phase)
				bytes := r.Rec.Traffic.DispatchAlgorithm
				if phase == "combine" {
					bytes = r.Rec.Traffic.CombineAlgorithm
				}
				if ph == nil || bytes == 0 {
					continue
				}
				b := float64(smBudget(r.Rec))
				lo, hi = min(lo, b), max(hi, b)
				// GB/s falls as time grows: the p10 time gives the p90 rate
				mid := GBps(bytes, r.Rec.Config.EP, ph.P50) / b
				var fast, slow float64 = mid, mid
				if t, ok := percentile(ph.Samples, 10); ok && t > 0 {
					fast = GBps(bytes, r.Rec.Config.EP, t) / b
				}
				if t, ok := percentile(ph.Samples, 90); ok && t > 0 {
					slow = GBps(bytes, r.Rec.Config.EP, t) / b
				}
				xy = append(xy, plotter.XY{X: b, Y: mid})
				eb = append(eb, whisker{x: b, y: mid, low: max(0, mid-slow), high: max(0, fast-mid)})
			}
			if len(xy) == 0 {
				continue
			}
			if err := addLine(p, leg, k+" "+phase, xy, eb, colorOf(n), false); err != nil {
				return nil, err
			}
			n++
		}
	}
	pad := max(1, (hi-lo)*0.08)
	p.X.Min, p.X.Max = lo-pad, hi+pad
	svg, err := render(p, leg)
	return &chart{Kind: "gbps_per_sm", SVG: svg, Caption: "Dispatch and combine GB/s per SM of the budget, in the design's own byte convention (DeepEP's: each (token, destination rank) once), a rank's share over the phase."}, err
}

// addLine adds a line with points (dashed: a reference without points) and
// its whiskers.
func addLine(p *plot.Plot, leg *legend, name string, xy plotter.XYs, eb errBars, c color.Color, dashed bool) error {
	l, err := plotter.NewLine(xy)
	if err != nil {
		return err
	}
	l.Color, l.Width = c, vg.Points(1.5)
	if dashed {
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(l)
		leg.add(name, l)
		return nil
	}
	s, err := plotter.NewScatter(xy)
	if err != nil {
		return err
	}
	s.Color = c
	p.Add(l, s)
	leg.add(name, l, s)
	if len(eb) > 0 {
		e, err := plotter.NewYErrorBars(eb)
		if err != nil {
			return err
		}
		e.Color, e.Width = c, vg.Points(1)
		p.Add(e)
	}
	return nil
}

// legend collects a chart's legend entries, drawn beside the plot.
type legend struct {
	names  []string
	thumbs [][]plot.Thumbnailer
}

func newLegend() *legend { return &legend{} }

func (l *legend) add(name string, t ...plot.Thumbnailer) {
	l.names = append(l.names, name)
	l.thumbs = append(l.thumbs, t)
}

func (l *legend) reverse() {
	for i, j := 0, len(l.names)-1; i < j; i, j = i+1, j-1 {
		l.names[i], l.names[j] = l.names[j], l.names[i]
		l.thumbs[i], l.thumbs[j] = l.thumbs[j], l.thumbs[i]
	}
}

// render draws p with leg's entries in a column to the right of it, as an
// SVG element for inline use (no XML declaration).
func render(p *plot.Plot, l *legend) (template.HTML, error) {
	c := vgsvg.New(chartW, chartH)
	dc := draw.New(c)
	leg := plot.NewLegend()
	leg.TextStyle.Font.Size, leg.TextStyle.Font.Variant = vg.Points(9), sans
	leg.ThumbnailWidth = vg.Points(14)
	leg.Top, leg.Left = true, true
	for i, n := range l.names {
		leg.Add(n, l.thumbs[i]...)
	}
	var lw vg.Length
	if len(l.names) > 0 {
		r := leg.Rectangle(dc)
		lw = r.Max.X - r.Min.X + vg.Points(10)
	}
	p.Draw(draw.Crop(dc, 0, -lw, 0, 0))
	if len(l.names) > 0 {
		leg.Draw(draw.Crop(dc, chartW-lw+vg.Points(4), 0, 0, -vg.Points(22)))
	}
	var b bytes.Buffer
	if _, err := c.WriteTo(&b); err != nil {
		return "", err
	}
	s := b.String()
	if i := strings.Index(s, "<svg"); i >= 0 {
		s = s[i:]
	}
	return template.HTML(s), nil // produced by gonum/plot from our numbers and escaped labels
}
