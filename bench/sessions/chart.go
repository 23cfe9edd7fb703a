package main

import (
	"fmt"
	"image"
	"image/color"
	"math"

	"github.com/ziptrail/ziptrail/bench/internal/chart"
)

var (
	measured  = color.RGBA{32, 120, 220, 255}
	shortRun  = color.RGBA{110, 180, 240, 255}
	steady    = color.RGBA{240, 160, 30, 255}
	withRedis = color.RGBA{220, 60, 50, 255}
)

// writeChart draws sessions/s: each measured run (1 and 2 replicas, in
// run order), then the projection's ceilings per replica count.
func writeChart(path string, r *Report) error {
	const w, h, left, bottom, top = 1000, 440, 70, 70, 40
	c := chart.New(w, h)
	type bar struct {
		label string
		v     float64
		col   color.Color
	}
	var groups [][]bar
	for _, cs := range r.Cases {
		groups = append(groups, []bar{{fmt.Sprintf("run %d: %d", cs.Run, cs.Replicas), cs.SessionsPerSec, measured}})
	}
	if p := r.Projection; p != nil {
		for _, row := range p.Rows {
			groups = append(groups, []bar{{fmt.Sprintf("N=%d", row.Replicas), row.ShortCeiling, shortRun},
				{"", row.SteadyCeiling, steady}, {"", row.Effective, withRedis}})
		}
	}
	maxV := 1.0
	for _, g := range groups {
		for _, b := range g {
			maxV = math.Max(maxV, b.v)
		}
	}
	plotH := float64(h - bottom - top)
	top10 := math.Pow(10, math.Ceil(math.Log10(maxV)))
	y := func(v float64) int {
		v = math.Max(v, 1)
		return h - bottom - int(plotH*math.Log10(v)/math.Log10(top10))
	}
	for v := 1.0; v <= top10; v *= 10 {
		c.GridLine(y(v), left, w-10, fmt.Sprint(v))
	}
	c.Label(left, 20, "sessions/s (log): measured runs (1 and 2 replicas, one core each), then projected ceilings", color.Black)
	groupW := (w - left - 20) / max(len(groups), 1)
	for gi, g := range groups {
		gx := left + gi*groupW + 6
		barW := (groupW - 12) / len(g)
		for bi, b := range g {
			x0 := gx + bi*barW
			c.Fill(image.Rect(x0, y(b.v), x0+barW-2, h-bottom), b.col)
		}
		c.Label(gx, h-bottom+16, g[0].label, color.Black)
	}
	c.Legend(left, []string{"measured", "proj. none kept", "proj. 1 h kept", "proj. + Redis"},
		[]color.Color{measured, shortRun, steady, withRedis})
	return c.SavePNG(path)
}
