// Package chart draws the benchmarks' PNG bar charts (bench/dataplane,
// bench/sort): a white canvas, grid lines with labels, bars, a legend.
package chart

import (
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"os"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// Grid is the colour of grid lines.
var Grid = color.RGBA{225, 225, 225, 255}

// Canvas is a chart being drawn.
type Canvas struct {
	img  *image.RGBA
	W, H int
}

// New is a white w×h canvas.
func New(w, h int) *Canvas {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	return &Canvas{img: img, W: w, H: h}
}

// Label writes s with its baseline at (x, y).
func (c *Canvas) Label(x, y int, s string, col color.Color) {
	d := font.Drawer{Dst: c.img, Src: image.NewUniform(col), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

// GridLine draws a horizontal grid line at y from x0 to x1 and its label at
// the left edge.
func (c *Canvas) GridLine(y, x0, x1 int, label string) {
	for x := x0; x < x1; x++ {
		c.img.Set(x, y, Grid)
	}
	c.Label(5, y+4, label, color.Black)
}

// Fill paints a rectangle (a bar, a tick).
func (c *Canvas) Fill(r image.Rectangle, col color.Color) {
	draw.Draw(c.img, r, image.NewUniform(col), image.Point{}, draw.Src)
}

// Legend draws a swatch and a name per entry along the bottom edge, every
// 150 pixels from x0.
func (c *Canvas) Legend(x0 int, names []string, colors []color.Color) {
	for i, name := range names {
		x := x0 + i*150
		c.Fill(image.Rect(x, c.H-22, x+12, c.H-10), colors[i])
		c.Label(x+18, c.H-11, name, color.Black)
	}
}

// SavePNG writes the chart to path.
func (c *Canvas) SavePNG(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, c.img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
