package main

import (
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
	"raw TCP":      {120, 120, 120, 255},
	"ziptrail":     {32, 120, 220, 255},
	"ziptrail SDK": {110, 180, 240, 255},
	"Redis":        {220, 60, 50, 255},
	"S3":           {240, 160, 30, 255},
}

// writeChart draws 1-1 throughput (MB/s, log scale) per object size.
func writeChart(path string, results []Result, systems []string) error {
	const w, h, left, bottom, top = 900, 420, 70, 60, 40
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	label := func(x, y int, s string, c color.Color) {
		d := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
		d.DrawString(s)
	}
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
		yy := y(v)
		for x := left; x < w-10; x++ {
			img.Set(x, yy, color.RGBA{225, 225, 225, 255})
		}
		label(5, yy+4, fmtMB(v), color.Black)
	}
	label(left, 20, "1-1 transfer throughput, MB/s (log scale), measured side by side", color.Black)
	groupW := (w - left - 20) / max(len(sizes), 1)
	barW := (groupW - 20) / max(len(systems), 1)
	for gi, size := range sizes {
		gx := left + gi*groupW + 10
		for si, sys := range systems {
			for _, r := range results {
				if r.Pattern == "1-1" && r.Size == size && r.System == sys {
					x0 := gx + si*barW
					draw.Draw(img, image.Rect(x0, y(r.MBps), x0+barW-4, h-bottom), image.NewUniform(palette[sys]), image.Point{}, draw.Src)
				}
			}
		}
		label(gx+groupW/2-25, h-bottom+18, human(size), color.Black)
	}
	for si, sys := range systems {
		x := left + si*150
		draw.Draw(img, image.Rect(x, h-22, x+12, h-10), image.NewUniform(palette[sys]), image.Point{}, draw.Src)
		label(x+18, h-11, sys, color.Black)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return png.Encode(f, img)
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
