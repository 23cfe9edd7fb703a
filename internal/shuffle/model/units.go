package model

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Byte units.
const (
	KiB = 1 << 10
	MiB = 1 << 20
	GiB = 1 << 30
	TiB = 1 << 40
	KB  = 1e3
	MB  = 1e6
	GB  = 1e9
	TB  = 1e12
)

var byteUnits = map[string]float64{
	"": 1, "b": 1,
	"k": KB, "kb": KB, "ki": KiB, "kib": KiB,
	"m": MB, "mb": MB, "mi": MiB, "mib": MiB,
	"g": GB, "gb": GB, "gi": GiB, "gib": GiB,
	"t": TB, "tb": TB, "ti": TiB, "tib": TiB,
}

// ParseBytes parses a size such as "4GiB", "1.5GB", "512Mi", "100MB" or
// "1048576": binary units (KiB, MiB, GiB, TiB, or Kubernetes' Ki, Mi, Gi,
// Ti) are powers of 1024, decimal ones (KB, MB, GB, TB, K, M, G, T) powers
// of 1000. Case does not matter.
func ParseBytes(s string) (float64, error) {
	t := strings.TrimSpace(s)
	i := len(t)
	for i > 0 && (t[i-1] < '0' || t[i-1] > '9') && t[i-1] != '.' {
		i--
	}
	num, unit := strings.TrimSpace(t[:i]), strings.ToLower(strings.TrimSpace(t[i:]))
	mult, ok := byteUnits[unit]
	if !ok || num == "" {
		return 0, fmt.Errorf("size %q: want a number with an optional unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)", s)
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
		return 0, fmt.Errorf("size %q: not a non-negative number", s)
	}
	return v * mult, nil
}

// FormatBytes prints a size in binary units with up to three significant
// digits ("4 GiB", "1.5 GiB", "320 MiB").
func FormatBytes(b float64) string {
	units := []struct {
		name string
		size float64
	}{{"TiB", TiB}, {"GiB", GiB}, {"MiB", MiB}, {"KiB", KiB}}
	for _, u := range units {
		if b >= u.size {
			return strconv.FormatFloat(roundSig(b/u.size, 3), 'f', -1, 64) + " " + u.name
		}
	}
	return strconv.FormatFloat(roundSig(b, 3), 'f', -1, 64) + " B"
}

func roundSig(v float64, digits int) float64 {
	if v == 0 {
		return 0
	}
	p := math.Pow(10, float64(digits)-math.Ceil(math.Log10(math.Abs(v))))
	return math.Round(v*p) / p
}

// FormatSeconds prints a duration in seconds readably ("850ms", "12.3s",
// "4m5s", "2h3m").
func FormatSeconds(s float64) string {
	switch {
	case math.IsInf(s, 1):
		return "∞"
	case s < 1:
		return strconv.FormatFloat(roundSig(s*1000, 3), 'f', -1, 64) + "ms"
	case s < 60:
		return strconv.FormatFloat(roundSig(s, 3), 'f', -1, 64) + "s"
	case s < 3600:
		m := math.Floor(s / 60)
		return fmt.Sprintf("%.0fm%.0fs", m, math.Floor(s-60*m))
	default:
		h := math.Floor(s / 3600)
		return fmt.Sprintf("%.0fh%.0fm", h, math.Floor((s-3600*h)/60))
	}
}

// FormatDollars prints an amount of money with four significant digits.
func FormatDollars(d float64) string {
	if d >= 100 {
		return fmt.Sprintf("$%.2f", d)
	}
	return "$" + strconv.FormatFloat(roundSig(d, 4), 'f', -1, 64)
}
