package results

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moebench/moebench/internal/hostsim"
)

// The HTML report checked as a person sees it: laid out by a real browser
// (headless Chromium), not by reading the HTML.

// chromium is the browser's path; the test skips without one unless
// MOEBENCH_REQUIRE_CHROMIUM=1 (CI installs Debian's chromium and sets it).
// MOEBENCH_CHROMIUM may name the binary.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("MOEBENCH_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("MOEBENCH_REQUIRE_CHROMIUM") == "1" {
		t.Fatal("MOEBENCH_REQUIRE_CHROMIUM=1 but no chromium on the path (Debian: apt-get install chromium; or set MOEBENCH_CHROMIUM)")
	}
	t.Skip("no headless browser: install Debian's chromium (or set MOEBENCH_CHROMIUM) to check the HTML report's layout")
	return ""
}

// browse loads file in a headless window w pixels wide and returns the DOM
// after its scripts ran; with shot set it also writes a screenshot there.
func browse(t *testing.T, bin, file string, w int, shot string) string {
	t.Helper()
	args := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--hide-scrollbars", "--user-data-dir=" + t.TempDir(), fmt.Sprintf("--window-size=%d,900", w)}
	if shot != "" {
		args = append(args, "--screenshot="+shot, fmt.Sprintf("--window-size=%d,6000", w))
	} else {
		args = append(args, "--dump-dom")
	}
	cmd := exec.Command(bin, append(args, "file://"+file)...)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: %v\n%s", bin, err, stderr.String())
		}
	case <-time.After(hostsim.Patience(t, 60*time.Second)):
		cmd.Process.Kill()
		t.Fatalf("%s did not finish in %v\n%s", bin, hostsim.Patience(t, 60*time.Second), stderr.String())
	}
	return out.String()
}

// probe measures the laid-out page and writes what it found, as JSON, into
// a <pre id="probe"> that --dump-dom prints.
const probe = `<script>
(function () {
  var vw = document.documentElement.clientWidth, out = {viewport: vw,
    pageWidth: document.documentElement.scrollWidth, tables: [], charts: []};
  document.querySelectorAll("table").forEach(function (t) {
    var box = t.getBoundingClientRect(), sc = t.closest(".scroll"), c = null;
    if (sc) { var b = sc.getBoundingClientRect();
      c = {right: b.right, overflowX: getComputedStyle(sc).overflowX}; }
    out.tables.push({cls: t.className, right: box.right, rows: t.rows.length,
      group: t.closest("section") ? Array.prototype.indexOf.call(document.querySelectorAll("section"), t.closest("section")) : -1,
      container: c});
  });
  document.querySelectorAll("figure.chart").forEach(function (f) {
    var s = f.querySelector("svg"), b = s ? s.getBoundingClientRect() : {width: 0, height: 0, right: 0};
    var texts = [];
    if (s) s.querySelectorAll("text").forEach(function (x) { texts.push(x.textContent.trim()); });
    out.charts.push({kind: f.dataset.chart, width: b.width, height: b.height, right: b.right,
      group: Array.prototype.indexOf.call(document.querySelectorAll("section"), f.closest("section")),
      shapes: s ? s.querySelectorAll("path").length : 0, texts: texts});
  });
  var pre = document.createElement("pre"); pre.id = "probe";
  pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
})();
</script></body>`

type probed struct {
	Viewport  float64 `json:"viewport"`
	PageWidth float64 `json:"pageWidth"`
	Tables    []struct {
		Cls       string  `json:"cls"`
		Right     float64 `json:"right"`
		Rows      int     `json:"rows"`
		Group     int     `json:"group"`
		Container *struct {
			Right     float64 `json:"right"`
			OverflowX string  `json:"overflowX"`
		} `json:"container"`
	} `json:"tables"`
	Charts []struct {
		Kind   string   `json:"kind"`
		Width  float64  `json:"width"`
		Height float64  `json:"height"`
		Right  float64  `json:"right"`
		Group  int      `json:"group"`
		Shapes int      `json:"shapes"`
		Texts  []string `json:"texts"`
	} `json:"charts"`
}

// browserRecords: one host workload with alltoall, deepep at three SM
// budgets (its own phases: layout, notify, permute after dispatch), feplb
// (rebalance and dynamic, a rebalancing table) and an unavailable hybridep;
// per-iteration samples throughout.
func browserRecords() []Record {
	g := rand.New(rand.NewPCG(7, 7))
	mk := func(d string, budget int, phases []string, ms []float64) Record {
		r := *sample(StatusOK)
		r.Config.Dispatcher, r.Config.SMs, r.SMs.Configured, r.SMs.Budget = d, budget, budget, budget
		r.SMs.Measured = "not measured on the host device"
		r.Config.EP, r.Config.Tokens, r.Config.Hidden, r.Config.TopK, r.Config.Iters = 8, 128, 128, 4, 20
		t := &Timing{Unit: "ms", Iters: 20, StepIs: StepLockstep}
		lock := make([]float64, 20)
		for i, name := range phases {
			s := noisy(g, 20, ms[i], 0.1)
			for j, v := range s {
				lock[j] += v
			}
			t.Phases = append(t.Phases, Phase{Name: name, Stat: Stat{P50: ms[i]}, Samples: s})
		}
		var sum float64
		for _, v := range ms {
			sum += v
		}
		rank := noisy(g, 20, 0.8*sum, 0.05)
		t.Lockstep = &Phase{Name: "step_lockstep", Stat: Stat{P50: sum}, Samples: lock}
		t.SlowestRank = &Phase{Name: "step_slowest_rank", Stat: Stat{P50: 0.8 * sum}, Samples: rank, PerRank: []float64{0.7 * sum, 0.8 * sum}}
		t.Step = *t.Lockstep
		t.Step.Name = "step"
		r.Timing = t
		r.Tokens = &Tokens{Received: []int{500, 524}, Straggler: Straggler{Rel: 0.05}}
		r.GEMM = &GEMM{Straggler: Straggler{Rel: 0.04, PerRank: []float64{1, 1.04}}}
		r.Memory = &Memory{PerRankBytes: []int64{3 << 20}}
		r.Correctness = &Correctness{Checked: true, Passed: true, MaxRelErr: 0.006}
		alg := int64(8 * 128 * 4 * 128 * 2)
		r.Traffic = &Traffic{DispatchAlgorithm: alg, CombineAlgorithm: alg}
		r.Traffic.DispatchGBps, r.Traffic.CombineGBps = GBps(alg, 8, phaseP50(&r, "dispatch")), GBps(alg, 8, phaseP50(&r, "combine"))
		if budget > 0 {
			r.Traffic.DispatchGBpsPerSM, r.Traffic.CombineGBpsPerSM = r.Traffic.DispatchGBps/float64(budget), r.Traffic.CombineGBps/float64(budget)
		}
		return r
	}
	classic := []string{"shared", "router", "permute", "dispatch", "experts", "combine", "unpermute"}
	deep := []string{"shared", "router", "layout", "notify", "dispatch", "permute", "experts", "combine"}
	fe := []string{"shared", "router", "permute", "dispatch", "experts", "rebalance", "dynamic", "combine", "unpermute"}
	recs := []Record{mk("alltoall", 0, classic, []float64{0.8, 0.1, 0.03, 0.05, 3, 0.06, 0.05})}
	for _, sms := range []int{8, 16, 24} {
		recs = append(recs, mk("deepep", sms, deep, []float64{0.8, 0.1, 0.004, 0.008, 0.3 / float64(sms) * 8, 0.04, 3, 0.2}))
	}
	f := mk("feplb", 0, fe, []float64{0.8, 0.1, 0.03, 0.05, 2, 0.1, 1.5, 0.06, 0.05})
	f.Config.FeplbBase, f.Config.FeplbDynamic = "alltoall", 4
	f.Rebalance = &Rebalance{Policy: "feplb", TokenBefore: Straggler{PerRank: []float64{1, 3}, Rel: 0.5}, TokenAfter: Straggler{PerRank: []float64{2, 2}},
		GEMMBefore: Straggler{PerRank: []float64{1, 2}, Rel: 0.33}, Moves: 3, CopyBytes: 1 << 20, CopyMS: 0.1,
		ExposedNote: "not measured: the host device runs the copies in their own phase", SchedulerMS: 0.03}
	un := *sample(StatusUnavailable)
	un.Config = recs[0].Config
	un.Config.Dispatcher, un.Config.SMs, un.Reason = "hybridep", 16, "needs the cuda device"
	return append(recs, f, un)
}

// TestHTMLInBrowser lays the report out in headless Chromium, 1400 and
// 700 pixels wide, and checks what a reader would see: no table runs off
// the window unless inside a container that scrolls sideways, and the
// page itself never does; every chart is drawn with a nonzero size inside
// the window; the per-phase chart's legend names every phase of every row
// (feplb's rebalance and dynamic, deepep's layout and notify); each group
// has its step, phase and dispatch/combine charts, the SM-budget and
// GB/s-per-SM charts, and the rebalancing table. MOEBENCH_SCREENSHOT_DIR
// keeps a screenshot of each width for a person to look at.
func TestHTMLInBrowser(t *testing.T) {
	bin := chromium(t)
	var page bytes.Buffer
	if err := WriteReport(&page, BuildReport(browserRecords()), "html", "browser test"); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "report.html")
	withProbe := strings.Replace(page.String(), "</body>", probe, 1)
	if err := os.WriteFile(file, []byte(withProbe), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, w := range []int{1400, 700} {
		t.Run(fmt.Sprintf("%dpx", w), func(t *testing.T) {
			dom := browse(t, bin, file, w, "")
			m := regexp.MustCompile(`(?s)<pre id="probe">(.*?)</pre>`).FindStringSubmatch(dom)
			if m == nil {
				t.Fatalf("%d px: the probe wrote nothing; DOM:\n%.2000s", w, dom)
			}
			var p probed
			if err := json.Unmarshal([]byte(html.UnescapeString(m[1])), &p); err != nil {
				t.Fatal(err)
			}
			if p.PageWidth > p.Viewport {
				t.Errorf("%d px: the page is %.0f px wide: it scrolls sideways", w, p.PageWidth)
			}
			classes := map[string]int{}
			for _, tb := range p.Tables {
				classes[tb.Cls]++
				fits := tb.Right <= p.Viewport
				scrolls := tb.Container != nil && (tb.Container.OverflowX == "auto" || tb.Container.OverflowX == "scroll") && tb.Container.Right <= p.Viewport
				if !fits && !scrolls {
					t.Errorf("%d px: table %q ends at %.0f px, past the window, and no container scrolls it", w, tb.Cls, tb.Right)
				}
			}
			if classes["points"] != 1 || classes["rebalance"] != 1 {
				t.Errorf("%d px: tables %v, want one of points and one rebalancing table", w, classes)
			}
			kinds := map[string]bool{}
			for _, c := range p.Charts {
				kinds[c.Kind] = true
				if c.Width < 100 || c.Height < 60 || c.Shapes < 5 {
					t.Errorf("%d px: chart %s is %.0f×%.0f px with %d shapes", w, c.Kind, c.Width, c.Height, c.Shapes)
				}
				if c.Right > p.Viewport+0.5 {
					t.Errorf("%d px: chart %s ends at %.0f px, past the window", w, c.Kind, c.Right)
				}
				if c.Kind == "phases" {
					for _, ph := range []string{"shared", "router", "layout", "notify", "permute", "dispatch", "experts", "rebalance", "dynamic", "combine", "unpermute"} {
						if !slices.Contains(c.Texts, ph) {
							t.Errorf("%d px: the per-phase chart's legend lacks %q: %q", w, ph, c.Texts)
						}
					}
				}
			}
			for _, k := range []string{"step", "phases", "transfer", "sms", "gbps_per_sm"} {
				if !kinds[k] {
					t.Errorf("%d px: no %s chart (charts: %v)", w, k, kinds)
				}
			}
			if dir := os.Getenv("MOEBENCH_SCREENSHOT_DIR"); dir != "" {
				browse(t, bin, file, w, filepath.Join(dir, fmt.Sprintf("report-%d.png", w)))
			}
		})
	}
}
