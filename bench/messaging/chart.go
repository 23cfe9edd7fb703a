package main

import (
	"bytes"
	"fmt"
	"html"
	"math"
)

var palette = map[string]string{
	"ziptrail":                              "#2078dc",
	sysDirect:                               "#14a05a",
	sysDirectProcs:                          "#7cc89a",
	sysDirectRecycled:                       "#0a6e3c",
	sysSidecars:                             "#2078dc",
	sysTCP:                                  "#8c3cc8",
	sysTCPProcs:                             "#c39be6",
	sysTCPRecycled:                          "#5a1e8c",
	sysSidecars + " (8 sending goroutines)": "#7ab0ec",
	"Redis":                                 "#dc3c32",
	"Redis (pipelined LPUSH)":               "#f0a01e",
	"p50":                                   "#2078dc",
	"p99":                                   "#8cb4e6",
}

// panel is one grouped bar chart: values[series][group] in seconds.
type panel struct {
	title  string
	groups []string
	series []string
	values [][]float64
}

// chart draws the four measurements as SVG panels, log-scale times (p50).
func chart(results []Result) []byte {
	var ps []panel
	for _, sec := range []struct{ id, title string }{
		{"fig7", "Fig. 7: one message, one-way p50 (log)"},
		{"fig8", "Fig. 8: N × 64 B back to back, total p50 (log)"},
		{"allreduce", "allreduce of 1 MB float64, p50 (log)"},
	} {
		p := panel{title: sec.id}
		p.title = sec.title
		gi, si := map[string]int{}, map[string]int{}
		for _, r := range results {
			if r.Section != sec.id {
				continue
			}
			if _, ok := gi[r.Case]; !ok {
				gi[r.Case] = len(p.groups)
				p.groups = append(p.groups, r.Case)
			}
			if _, ok := si[r.System]; !ok {
				si[r.System] = len(p.series)
				p.series = append(p.series, r.System)
				p.values = append(p.values, nil)
			}
		}
		for s := range p.values {
			p.values[s] = make([]float64, len(p.groups))
		}
		for _, r := range results {
			if r.Section == sec.id {
				p.values[si[r.System]][gi[r.Case]] = r.P50
			}
		}
		if len(p.groups) > 0 {
			ps = append(ps, p)
		}
	}
	live := panel{title: "ziptrail membership and failure detection (log)", series: []string{"p50", "p99"}, values: make([][]float64, 2)}
	for _, r := range results {
		if r.Section == "membership" || r.Section == "death" {
			name := map[string]string{"join seen by all": "join seen", "Join call": "Join call", "PeerGone at all": "SIGKILL→PeerGone"}[r.Case]
			live.groups = append(live.groups, name)
			live.values[0] = append(live.values[0], r.P50)
			live.values[1] = append(live.values[1], r.P99)
		}
	}
	if len(live.groups) > 0 {
		ps = append(ps, live)
	}

	const pw, ph = 560, 330
	cols := 2
	rows := (len(ps) + 1) / 2
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", cols*pw, rows*ph+30)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="10" y="18" font-size="13">ziptrail direct messages vs Redis LPUSH/BRPOP, measured side by side (bench/messaging)</text>`+"\n")
	for i, p := range ps {
		drawPanel(&b, 10+(i%cols)*pw, 30+(i/cols)*ph, pw-20, ph-10, p)
	}
	b.WriteString("</svg>\n")
	return b.Bytes()
}

func drawPanel(b *bytes.Buffer, x0, y0, w, h int, p panel) {
	const left, bottom, top, legend = 58, 56, 22, 16
	lo, hi := math.Inf(1), 0.0
	for _, vs := range p.values {
		for _, v := range vs {
			if v > 0 {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
	}
	if hi == 0 {
		return
	}
	dlo, dhi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if dhi == dlo {
		dhi++
	}
	plotH := float64(h - bottom - top - legend)
	base := y0 + top + int(plotH)
	y := func(v float64) int {
		if v <= 0 {
			return base
		}
		return base - int(plotH*(math.Log10(v)-dlo)/(dhi-dlo))
	}
	fmt.Fprintf(b, `<text x="%d" y="%d" font-size="12" font-weight="bold">%s</text>`+"\n", x0, y0+14, html.EscapeString(p.title))
	for d := dlo; d <= dhi; d++ {
		v := math.Pow(10, d)
		yy := y(v)
		fmt.Fprintf(b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#e0e0e0"/>`+"\n", x0+left, x0+w, yy, yy)
		fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", x0+left-4, yy+4, html.EscapeString(tick(v)))
	}
	groupW := float64(w-left) / float64(max(len(p.groups), 1))
	barW := (groupW - 12) / float64(max(len(p.series), 1))
	for g, name := range p.groups {
		gx := float64(x0+left) + float64(g)*groupW + 6
		for s, series := range p.series {
			v := p.values[s][g]
			if v <= 0 {
				continue
			}
			bx := gx + float64(s)*barW
			fmt.Fprintf(b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"><title>%s %s: %s</title></rect>`+"\n",
				bx, y(v), barW-2, base-y(v), palette[series], html.EscapeString(series), html.EscapeString(name), html.EscapeString(dur(v)))
		}
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", gx+(groupW-12)/2, base+14, html.EscapeString(name))
	}
	lx, ly := x0+left, base+22
	for _, series := range p.series {
		sw := 24 + 6*len(series)
		if lx+sw > x0+w {
			lx, ly = x0+left, ly+14
		}
		fmt.Fprintf(b, `<rect x="%d" y="%d" width="10" height="10" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n",
			lx, ly, palette[series], lx+14, ly+9, html.EscapeString(series))
		lx += sw
	}
}

func tick(v float64) string {
	switch {
	case v < 1e-3:
		return fmt.Sprintf("%g µs", math.Round(v*1e6*1000)/1000)
	case v < 1:
		return fmt.Sprintf("%g ms", math.Round(v*1e3*1000)/1000)
	}
	return fmt.Sprintf("%g s", v)
}
