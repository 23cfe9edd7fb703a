package main

import (
	"image"
	"image/color"
	"math"

	"github.com/ziptrail/ziptrail/bench/internal/chart"
)

var palette = map[string]color.RGBA{
	"raw TCP":      {120, 120, 120, 255},
	"ziptrail":     {32, 120, 220, 255},
	"ziptrail SDK": {110, 180, 240, 255},
	sdkInPlace:     {60, 200, 200, 255},
	"Redis":        {220, 60, 50, 255},
	"S3":           {240, 160, 30, 255},
}

// writeChart draws 1-1 throughput (MB/s, log scale) per object size.
func writeChart(path string, results []Result, systems []string) error {
	const w, h, left, bottom, top = 900, 420, 70, 60, 40
	c := chart.New(w, h)
	var sizes []int
	seen := map[int]bool{}
	maxMB := 1.0
	for _, r := range results {
		if r.Pattern != "1-1" {
			continue
		}
		if !seen[r.Size] {
			seen[r.Size] = true
			sizes = append(sizes, r.Size)
		}
		maxMB = math.Max(maxMB, r.MBps)
	}
	plotH := float64(h - bottom - top)
	top10 := math.Pow(10, math.Ceil(math.Log10(maxMB)))
	y := func(mb float64) int {
		if mb < 1 {
			mb = 1
		}
		return h - bottom - int(plotH*math.Log10(mb)/math.Log10(top10))
	}
	for v := 1.0; v <= top10; v *= 10 {
		c.GridLine(y(v), left, w-10, fmtMB(v))
	}
	c.Label(left, 20, "1-1 transfer throughput, MB/s (log scale), measured side by side", color.Black)
	groupW := (w - left - 20) / max(len(sizes), 1)
	barW := (groupW - 20) / max(len(systems), 1)
	for gi, size := range sizes {
		gx := left + gi*groupW + 10
		for si, sys := range systems {
			for _, r := range results {
				if r.Pattern == "1-1" && r.Size == size && r.System == sys {
					x0 := gx + si*barW
					c.Fill(image.Rect(x0, y(r.MBps), x0+barW-4, h-bottom), palette[sys])
				}
			}
		}
		c.Label(gx+groupW/2-25, h-bottom+18, human(size), color.Black)
	}
	colors := make([]color.Color, len(systems))
	for i, sys := range systems {
		colors[i] = palette[sys]
	}
	c.Legend(left, systems, colors)
	return c.SavePNG(path)
}

func fmtMB(v float64) string {
	if v >= 1000 {
		return fmtInt(int(v/1000)) + "k"
	}
	return fmtInt(int(v))
}

func fmtInt(n int) string {
	s := ""
	if n == 0 {
		return "0"
	}
	for n > 0 {
		s = string(rune('0'+n%10)) + s
		n /= 10
	}
	return s
}
