package main

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
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
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	label := func(x, y int, s string, c color.Color) {
		d := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
		d.DrawString(s)
	}
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
		yy := y(v)
		for x := left; x < w-10; x++ {
			img.Set(x, yy, color.RGBA{225, 225, 225, 255})
		}
		label(5, yy+4, fmt.Sprintf("%gs", v), color.Black)
	}
	label(left, 20, "sort time (s, without validation), measured bars; black tick: model prediction", color.Black)
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
					draw.Draw(img, image.Rect(x0, y(r.SortSeconds), x0+barW-4, h-bottom), image.NewUniform(palette[m]), image.Point{}, draw.Src)
					label(x0, y(r.SortSeconds)-3, fmt.Sprintf("%.0f", r.SortSeconds), color.Black)
				} else {
					label(x0+2, h-bottom-4, "n/a", color.Gray{100})
				}
				if r.Predicted > 0 && r.SortSeconds > 0 {
					yy := y(r.Predicted)
					draw.Draw(img, image.Rect(x0-2, yy-1, x0+barW-2, yy+2), image.Black, image.Point{}, draw.Src)
				}
			}
		}
		label(gx+groupW/2-25, h-bottom+18, human(size), color.Black)
	}
	for si, m := range order {
		x := left + si*150
		draw.Draw(img, image.Rect(x, h-22, x+12, h-10), image.NewUniform(palette[m]), image.Point{}, draw.Src)
		name := m
		if m == "ray" {
			name = "Ray (peer)"
		}
		label(x+18, h-11, name, color.Black)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return png.Encode(f, img)
}

func boolf(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
