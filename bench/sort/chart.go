package main

import (
	"fmt"
	"image"
	"image/color"
	"math"

	"github.com/ziptrail/ziptrail/bench/internal/chart"
)

var palette = map[string]color.RGBA{
	"s3":        {240, 160, 30, 255},
	"redis":     {220, 60, 50, 255},
	"podmemory": {32, 120, 220, 255},
	"hybrid":    {40, 160, 90, 255},
	"ray":       {120, 120, 120, 255},
}

var order = []string{"s3", "redis", "podmemory", "hybrid", "ray"}

// writeChart draws, per size, each method's measured sort time (session −
// validation; Ray: its sort) as a bar, the model's prediction as a black
// tick over ziptrail's bars.
func writeChart(path string, runs []Run) error {
	const w, h, left, bottom, top = 900, 440, 70, 70, 40
	c := chart.New(w, h)
	var sizes []int64
	seen := map[int64]bool{}
	maxS := 1.0
	for _, r := range runs {
		if !seen[r.Bytes] {
			seen[r.Bytes] = true
			sizes = append(sizes, r.Bytes)
		}
		maxS = math.Max(maxS, math.Max(r.SortSeconds, r.Predicted*boolf(r.SortSeconds > 0)))
	}
	step := math.Pow(10, math.Floor(math.Log10(maxS)))
	if maxS/step < 3 {
		step /= 2
	}
	topS := math.Ceil(maxS/step) * step
	plotH := float64(h - bottom - top)
	y := func(s float64) int { return h - bottom - int(plotH*s/topS) }
	for v := 0.0; v <= topS+1e-9; v += step {
		c.GridLine(y(v), left, w-10, fmt.Sprintf("%gs", v))
	}
	c.Label(left, 20, "sort time (s, without validation), measured bars; black tick: model prediction", color.Black)
	groupW := (w - left - 20) / max(len(sizes), 1)
	barW := (groupW - 20) / len(order)
	for gi, size := range sizes {
		gx := left + gi*groupW + 10
		for si, m := range order {
			for _, r := range runs {
				if r.Bytes != size || r.Method != m {
					continue
				}
				x0 := gx + si*barW
				if r.SortSeconds > 0 {
					c.Fill(image.Rect(x0, y(r.SortSeconds), x0+barW-4, h-bottom), palette[m])
					c.Label(x0, y(r.SortSeconds)-3, fmt.Sprintf("%.0f", r.SortSeconds), color.Black)
				} else {
					c.Label(x0+2, h-bottom-4, "n/a", color.Gray{100})
				}
				if r.Predicted > 0 && r.SortSeconds > 0 {
					yy := y(r.Predicted)
					c.Fill(image.Rect(x0-2, yy-1, x0+barW-2, yy+2), color.Black)
				}
			}
		}
		c.Label(gx+groupW/2-25, h-bottom+18, human(size), color.Black)
	}
	names, colors := make([]string, len(order)), make([]color.Color, len(order))
	for i, m := range order {
		names[i], colors[i] = m, palette[m]
		if m == "ray" {
			names[i] = "Ray (peer)"
		}
	}
	c.Legend(left, names, colors)
	return c.SavePNG(path)
}

func boolf(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
