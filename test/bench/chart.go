package bench

import (
	"fmt"
	"image/color"
	"math"
	"path/filepath"
	"slices"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// The charts are PNGs drawn with gonum/plot (no external tool), written
// next to the Markdown file.

// Chart is one rendered chart: its file name and what it shows.
type Chart struct {
	File, Title string
}

var programColors = map[string]color.Color{
	"kube-proxy": color.RGBA{R: 200, G: 60, B: 40, A: 255},
	"proxyshift": color.RGBA{R: 30, G: 90, B: 200, A: 255},
}

// Charts renders every chart into dir and lists them in order: first
// full sync and peak RSS against Service count, then one programming
// latency CDF per mode and size.
func (r *Report) Charts(dir string) ([]Chart, error) {
	var out []Chart
	for _, c := range []struct {
		chart Chart
		y     string
		value func(Result) (float64, bool)
	}{
		{Chart{ChartName, "First full sync against Service count"}, "seconds until the last Service answers",
			func(x Result) (float64, bool) { return x.FirstSync.Seconds(), !x.TimedOut }},
		{Chart{"benchmarks-rss.png", "Peak RSS (VmHWM) against Service count"}, "MiB", rssPoint},
	} {
		if err := r.sizeChart(filepath.Join(dir, c.chart.File), c.chart.Title, c.y, c.value); err != nil {
			return nil, err
		}
		out = append(out, c.chart)
	}
	for _, mode := range r.modes() {
		for _, n := range r.sizesOf(mode) {
			c := Chart{File: fmt.Sprintf("benchmarks-latency-%s-%d.png", mode, n),
				Title: fmt.Sprintf("Programming latency CDF, %s mode, %d services", mode, n)}
			drawn, err := r.latencyCDF(filepath.Join(dir, c.File), c.Title, mode, n)
			if err != nil {
				return nil, err
			}
			if drawn {
				out = append(out, c)
			}
		}
	}
	return out, nil
}

// rssPoint is a result's point on the RSS chart: none for a program
// that was not measured or whose first sync gave up (what it held until
// then is a lower bound, which the table shows as one).
func rssPoint(x Result) (float64, bool) {
	return float64(x.PeakRSS) / (1 << 20), x.PeakRSS > 0 && !x.TimedOut
}

// sizeChart draws value against Service count, one line per program
// and mode (solid for the first mode, dashed for the second).
func (r *Report) sizeChart(path, title, yLabel string, value func(Result) (float64, bool)) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "Services (10 endpoints each)"
	p.Y.Label.Text = yLabel
	p.Legend.Top, p.Legend.Left = true, true
	for mi, mode := range r.modes() {
		for _, prog := range []string{"kube-proxy", "proxyshift"} {
			var pts plotter.XYs
			for _, n := range r.sizes() {
				if res, ok := r.lookup(prog, mode, n); ok {
					if v, ok := value(res); ok {
						pts = append(pts, plotter.XY{X: float64(n), Y: v})
					}
				}
			}
			if len(pts) == 0 {
				continue
			}
			line, points, err := plotter.NewLinePoints(pts)
			if err != nil {
				return err
			}
			styleLine(line, points, prog, mi)
			p.Add(line, points)
			p.Legend.Add(fmt.Sprintf("%s, %s", prog, mode), line, points)
		}
	}
	return p.Save(7*vg.Inch, 4.5*vg.Inch, path)
}

func styleLine(line *plotter.Line, points *plotter.Scatter, prog string, variant int) {
	line.Color = programColors[prog]
	if points != nil {
		points.Color = programColors[prog]
	}
	if variant%2 == 1 {
		line.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
		if points != nil {
			points.Shape = draw.BoxGlyph{}
		}
	}
}

// latencyCDF draws the cumulative distribution of both programs'
// programming latencies in mode at n Services, on a logarithmic time
// axis; it draws nothing (false) when neither has a sample.
func (r *Report) latencyCDF(path, title, mode string, n int) (bool, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "EndpointSlice write -> new endpoint answers (ms, log scale)"
	p.Y.Label.Text = "fraction of changes"
	p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	// Above 1, room for the legend over the curves.
	p.Y.Min, p.Y.Max = 0, 1.25
	p.Legend.Top, p.Legend.Left = true, true
	drawn := false
	lo, hi := math.Inf(1), 0.0
	for i, prog := range []string{"kube-proxy", "proxyshift"} {
		res, ok := r.lookup(prog, mode, n)
		if !ok || len(res.Latency) == 0 {
			continue
		}
		pts := cdf(res.Latency)
		lo, hi = min(lo, pts[0].X), max(hi, pts[len(pts)-1].X)
		line, err := plotter.NewLine(pts)
		if err != nil {
			return false, err
		}
		styleLine(line, nil, prog, i)
		line.Width = vg.Points(1.5)
		p.Add(line)
		p.Legend.Add(fmt.Sprintf("%s (%d changes, p99 %s)", prog, len(res.Latency), fmtDuration(Percentile(res.Latency, 99))), line)
		drawn = true
	}
	if !drawn {
		return false, nil
	}
	// Room on both sides, so that the first and last steps show.
	p.X.Min, p.X.Max = lo/1.5, hi*1.5
	p.Add(plotter.NewGrid())
	return true, p.Save(7*vg.Inch, 4.5*vg.Inch, path)
}

// cdf is the empirical cumulative distribution of ds as a step line: x
// in milliseconds, y the fraction of samples at most x.
func cdf(ds []time.Duration) plotter.XYs {
	s := slices.Clone(ds)
	slices.Sort(s)
	pts := make(plotter.XYs, 0, 2*len(s))
	for i, d := range s {
		x := max(float64(d)/float64(time.Millisecond), 0.001)
		pts = append(pts, plotter.XY{X: x, Y: float64(i) / float64(len(s))}, plotter.XY{X: x, Y: float64(i+1) / float64(len(s))})
	}
	return pts
}
