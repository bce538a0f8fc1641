package bench

import (
	"fmt"
	"image/color"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Chart renders first full sync time (from outside) against Service
// count, one line per program and mode, as a PNG at path.
func (r *Report) Chart(path string) error {
	p := plot.New()
	p.Title.Text = "First full sync until the last Service answers"
	p.X.Label.Text = "Services (10 endpoints each)"
	p.Y.Label.Text = "seconds"
	p.Legend.Top, p.Legend.Left = true, true
	colors := map[string]color.Color{"kube-proxy": color.RGBA{R: 200, G: 60, B: 40, A: 255}, "proxyshift": color.RGBA{R: 30, G: 90, B: 200, A: 255}}
	for mi, mode := range r.modes() {
		for _, prog := range []string{"kube-proxy", "proxyshift"} {
			var pts plotter.XYs
			for _, n := range r.sizes() {
				if res, ok := r.lookup(prog, mode, n); ok && !res.TimedOut {
					pts = append(pts, plotter.XY{X: float64(n), Y: res.FirstSync.Seconds()})
				}
			}
			if len(pts) == 0 {
				continue
			}
			line, points, err := plotter.NewLinePoints(pts)
			if err != nil {
				return err
			}
			line.Color, points.Color = colors[prog], colors[prog]
			if mi%2 == 1 {
				line.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
				points.Shape = draw.BoxGlyph{}
			}
			p.Add(line, points)
			p.Legend.Add(fmt.Sprintf("%s, %s", prog, mode), line, points)
		}
	}
	return p.Save(7*vg.Inch, 4.5*vg.Inch, path)
}
