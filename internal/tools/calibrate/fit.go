package calibrate

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"

	"github.com/ziptrail/ziptrail/internal/shuffle/model"
)

// Sample is one per-worker bandwidth measured with Workers workers of
// Memory bytes (0: unknown, not varied) transferring at once.
type Sample struct {
	Workers   int
	Memory    float64
	PerWorker float64
}

// BandwidthFit is a fitted model.Bandwidth and how well it fits.
type BandwidthFit struct {
	Bandwidth model.Bandwidth
	// RMS is the root mean square residual of log b (0.1: the fit is off
	// by about 10 % at a typical point).
	RMS     float64
	Samples int
}

// FitBandwidth fits model.Bandwidth's form,
//
//	log b = log PerWorker + MemoryExponent·log(w/1 GiB) − ParallelismExponent·log(1 + p/ParallelismKnee),
//
// to samples by least squares on log b. For a fixed knee K the model is
// linear in (log PerWorker, MemoryExponent, ParallelismExponent), solved
// exactly (normal equations); K is searched on a log grid from 0.01 to
// 10⁴ and refined by golden-section search between the grid's neighbours.
// The exponent is kept in (0, 1] (fixed at 1, the rest re-fitted, when the
// data ask for more): with it the aggregate p·b(p) never falls as workers
// are added, so the fit does not extrapolate a collapse beyond the
// parallelism measured (a store that saturates is the server bandwidth's
// term). A decline is kept only if it fits better than no decline at all
// (ParallelismKnee 0); the memory term only if the
// samples have at least two different known memories. Max is the largest
// sample (the fit never promises more than was seen).
func FitBandwidth(samples []Sample) (BandwidthFit, error) {
	if len(samples) == 0 {
		return BandwidthFit{}, errors.New("no bandwidth samples")
	}
	mems, ps := map[float64]bool{}, map[int]bool{}
	for _, s := range samples {
		if !(s.PerWorker > 0) || math.IsInf(s.PerWorker, 0) || s.Workers < 1 {
			return BandwidthFit{}, fmt.Errorf("bad sample %+v: need workers ≥ 1 and a positive, finite bandwidth", s)
		}
		mems[s.Memory] = true
		ps[s.Workers] = true
	}
	useMem := len(mems) >= 2 && !mems[0]
	ys := make([]float64, len(samples))
	for i, s := range samples {
		ys[i] = math.Log(s.PerWorker)
	}
	memCol := func() []float64 {
		col := make([]float64, len(samples))
		for i, s := range samples {
			col[i] = math.Log(s.Memory / model.GiB)
		}
		return col
	}
	// solve fits with knee k (0: no parallelism term) and returns the
	// coefficients (intercept, memory exponent, parallelism exponent) and
	// the sum of squared residuals. The parallelism exponent is kept in
	// (0, 1]: above 1 it is fixed at 1 and the rest re-fitted (ok is false
	// for an exponent ≤ 0, which is no decline).
	solve := func(k float64) (c [3]float64, sse float64, ok bool) {
		cols := [][]float64{ones(len(samples))}
		if useMem {
			cols = append(cols, memCol())
		}
		var par []float64
		if k > 0 {
			par = make([]float64, len(samples))
			for i, s := range samples {
				par[i] = -math.Log1p(float64(s.Workers) / k)
			}
		}
		y := ys
		var x []float64
		beta := 0.0
		if k > 0 {
			x, ok = leastSquares(append(cols[:len(cols):len(cols)], par), ys)
			if !ok {
				return c, math.Inf(1), false
			}
			beta = x[len(x)-1]
			if beta <= 0 {
				return c, math.Inf(1), false
			}
			if beta > 1 {
				beta = 1
				y = make([]float64, len(ys))
				for i := range ys {
					y[i] = ys[i] - par[i]
				}
				x = nil
			} else {
				x = x[:len(x)-1]
			}
		}
		if x == nil {
			if x, ok = leastSquares(cols, y); !ok {
				return c, math.Inf(1), false
			}
		}
		c[0] = x[0]
		if useMem {
			c[1] = x[1]
		}
		c[2] = beta
		for i := range samples {
			pred := 0.0
			for j, col := range cols {
				pred += x[j] * col[i]
			}
			if k > 0 {
				pred += beta * par[i]
			}
			sse += (ys[i] - pred) * (ys[i] - pred)
		}
		return c, sse, true
	}

	bestC, bestSSE, ok := solve(0)
	if !ok {
		return BandwidthFit{}, errors.New("bandwidth fit is singular")
	}
	bestK := 0.0
	if len(ps) >= 2 {
		const lo, hi, steps = -2.0, 4.0, 120
		sseAt := func(lk float64) float64 { _, s, _ := solve(math.Pow(10, lk)); return s }
		gi, gsse := -1, math.Inf(1)
		for i := 0; i <= steps; i++ {
			lk := lo + (hi-lo)*float64(i)/steps
			_, s, ok := solve(math.Pow(10, lk))
			if ok && s < gsse {
				gi, gsse = i, s
			}
		}
		if gi >= 0 {
			a := lo + (hi-lo)*float64(max(gi-1, 0))/steps
			b := lo + (hi-lo)*float64(min(gi+1, steps))/steps
			lk := goldenMin(sseAt, a, b, 60)
			k := math.Pow(10, lk)
			c, s, ok := solve(k)
			if !ok || s > gsse {
				k = math.Pow(10, lo+(hi-lo)*float64(gi)/steps)
				c, s, _ = solve(k)
			}
			if s < bestSSE {
				bestC, bestSSE, bestK = c, s, k
			}
		}
	}
	f := BandwidthFit{Samples: len(samples), RMS: math.Sqrt(bestSSE / float64(len(samples)))}
	f.Bandwidth.PerWorker = math.Exp(bestC[0])
	f.Bandwidth.MemoryExponent = bestC[1]
	if bestK > 0 {
		f.Bandwidth.ParallelismKnee = bestK
		f.Bandwidth.ParallelismExponent = bestC[2]
	}
	for _, s := range samples {
		f.Bandwidth.Max = max(f.Bandwidth.Max, s.PerWorker)
	}
	return f, nil
}

func ones(n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = 1
	}
	return v
}

// leastSquares solves min ‖Σ x_j·cols_j − y‖² by the normal equations
// (at most three columns here) with partial pivoting.
func leastSquares(cols [][]float64, y []float64) ([]float64, bool) {
	n := len(cols)
	a := make([][]float64, n)
	for i := range a {
		a[i] = make([]float64, n+1)
		for j := 0; j < n; j++ {
			a[i][j] = dot(cols[i], cols[j])
		}
		a[i][n] = dot(cols[i], y)
	}
	for c := 0; c < n; c++ {
		p := c
		for r := c + 1; r < n; r++ {
			if math.Abs(a[r][c]) > math.Abs(a[p][c]) {
				p = r
			}
		}
		if math.Abs(a[p][c]) < 1e-12*max(1, math.Abs(a[c][c])) || a[p][c] == 0 {
			return nil, false
		}
		a[c], a[p] = a[p], a[c]
		for r := 0; r < n; r++ {
			if r == c {
				continue
			}
			f := a[r][c] / a[c][c]
			for k := c; k <= n; k++ {
				a[r][k] -= f * a[c][k]
			}
		}
	}
	x := make([]float64, n)
	for i := range x {
		x[i] = a[i][n] / a[i][i]
	}
	return x, true
}

func dot(a, b []float64) float64 {
	var s float64
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// goldenMin minimizes f on [a, b] by golden-section search.
func goldenMin(f func(float64) float64, a, b float64, iters int) float64 {
	g := (math.Sqrt(5) - 1) / 2
	c, d := b-g*(b-a), a+g*(b-a)
	fc, fd := f(c), f(d)
	for i := 0; i < iters; i++ {
		if fc < fd {
			b, d, fd = d, c, fc
			c = b - g*(b-a)
			fc = f(c)
		} else {
			a, c, fc = c, d, fd
			d = a + g*(b-a)
			fd = f(d)
		}
	}
	return (a + b) / 2
}

// FitRates makes a store's request-rate curve from its read and write rate
// points. At each size the curve's rate is the harmonic mean of the read
// and the write rate (the rate of a stream of half reads and half writes;
// the model charges one rate for both), or the one measured. A larger
// object never sustains more requests per second than a smaller one, so
// where the measurements say otherwise (noise between sizes that are both
// latency-bound) the offending neighbours are pooled (pool-adjacent-
// violators on log rate, which keeps the curve's geometric level): the
// returned notes say where.
func FitRates(reads, writes []RatePoint) (model.RateCurve, []string, error) {
	by := map[float64][]float64{}
	for _, ps := range [][]RatePoint{reads, writes} {
		for _, p := range ps {
			if !(p.PerSecond > 0) || !(p.Size > 0) {
				return model.RateCurve{}, nil, fmt.Errorf("bad rate point %+v", p)
			}
			by[p.Size] = append(by[p.Size], p.PerSecond)
		}
	}
	if len(by) == 0 {
		return model.RateCurve{}, nil, errors.New("no rate points")
	}
	sizes := make([]float64, 0, len(by))
	for s := range by {
		sizes = append(sizes, s)
	}
	sort.Float64s(sizes)
	logs := make([]float64, len(sizes))
	for i, s := range sizes {
		var inv float64
		for _, r := range by[s] {
			inv += 1 / r
		}
		logs[i] = math.Log(float64(len(by[s])) / inv)
	}
	fitted := nonIncreasing(logs)
	var notes []string
	c := model.RateCurve{}
	for i, s := range sizes {
		if math.Abs(fitted[i]-logs[i]) > 1e-9 {
			notes = append(notes, fmt.Sprintf("%s: %s/s measured, %s/s in the curve (pooled with a larger size that sustained more)", FormatSize(s), FormatCount(math.Exp(logs[i])), FormatCount(math.Exp(fitted[i]))))
		}
		c.Points = append(c.Points, model.RatePoint{Size: s, PerSecond: math.Exp(fitted[i])})
	}
	return c, notes, nil
}

// nonIncreasing is the least-squares non-increasing fit of v
// (pool-adjacent-violators).
func nonIncreasing(v []float64) []float64 {
	type block struct {
		sum float64
		n   int
	}
	var bs []block
	for _, x := range v {
		bs = append(bs, block{x, 1})
		for len(bs) >= 2 {
			a, b := bs[len(bs)-2], bs[len(bs)-1]
			if a.sum/float64(a.n) >= b.sum/float64(b.n) {
				break
			}
			bs = append(bs[:len(bs)-2], block{a.sum + b.sum, a.n + b.n})
		}
	}
	out := make([]float64, 0, len(v))
	for _, b := range bs {
		for i := 0; i < b.n; i++ {
			out = append(out, b.sum/float64(b.n))
		}
	}
	return out
}

// Saturation is the gain in aggregate bandwidth below which doubling the
// workers counts as no longer raising it, and Efficiency the fraction of
// linear scaling below which the workers together count as held back: in
// either case the store (or the network, or this machine's cores) is the
// limit, not the workers.
const (
	Saturation = 1.25
	Efficiency = 0.5
)

// saturated says whether a store's aggregate stopped growing with workers
// (points of one object size): the aggregate at the most workers is less
// than Saturation times the aggregate at the next fewer, or less than
// Efficiency times the fewest workers' aggregate scaled linearly (which
// noise in one doubling cannot hide).
func saturated(pts []BandwidthPoint) bool {
	by := map[int]float64{}
	for _, p := range pts {
		by[p.Workers] = max(by[p.Workers], p.Aggregate)
	}
	var ws []int
	for w := range by {
		ws = append(ws, w)
	}
	if len(ws) < 2 {
		return false
	}
	sort.Ints(ws)
	lo, prev, hi := ws[0], ws[len(ws)-2], ws[len(ws)-1]
	return by[hi] < Saturation*by[prev] || by[hi] < Efficiency*by[lo]*float64(hi)/float64(lo)
}

// Fit turns measurements into model.Params. Fields not measured (and the
// configuration fields PodStoreFraction, WorkerStartup,
// TaskMemoryFraction, SpeculateAfter and FastShards) keep base's values.
// The notes say what each fitted field came from and how well it fits; see
// the package doc for the rules.
func Fit(m *Measurements, base model.Params) (model.Params, []string, error) {
	p := base
	var notes []string
	note := func(format string, a ...any) { notes = append(notes, fmt.Sprintf(format, a...)) }
	fits := map[string]BandwidthFit{}
	for _, f := range []struct {
		store, op string
		dst       *model.Bandwidth
	}{{S3, Read, &p.SlowRead}, {S3, Write, &p.SlowWrite}, {Redis, Read, &p.FastRead}, {Redis, Write, &p.FastWrite}} {
		pts := m.bandwidth(f.store, f.op)
		if len(pts) == 0 {
			note("%s %s bandwidth: not measured, default kept", f.store, f.op)
			continue
		}
		size := largestSize(pts)
		var samples []Sample
		for _, pt := range atSize(pts, size) {
			samples = append(samples, Sample{Workers: pt.Workers, Memory: pt.WorkerMemory, PerWorker: pt.Typical()})
		}
		bf, err := FitBandwidth(samples)
		if err != nil {
			return model.Params{}, nil, fmt.Errorf("%s %s bandwidth: %w", f.store, f.op, err)
		}
		*f.dst = bf.Bandwidth
		fits[f.store+" "+f.op] = bf
		note("%s %s bandwidth: %s; rms log residual %.3f over %d points of %s objects", f.store, f.op, DescribeBandwidth(bf.Bandwidth), bf.RMS, bf.Samples, FormatSize(size))
	}

	if bf, ok := fits[S3+" "+Read]; ok {
		pts := m.bandwidth(S3, Read)
		var strag []float64
		for _, pt := range atSize(pts, largestSize(pts)) {
			pred := bf.Bandwidth.At(pt.Workers, pt.WorkerMemory)
			for _, v := range pt.PerWorker {
				if v > 0 && pred > 0 {
					strag = append(strag, v/pred)
				}
			}
		}
		if len(strag) >= 2 {
			sort.Sort(sort.Reverse(sort.Float64Slice(strag)))
			p.Stragglers = strag
			note("stragglers: %d per-worker s3 read samples over the fit, from %.2f to %.2f", len(strag), strag[len(strag)-1], strag[0])
		}
	}

	for _, r := range []struct {
		store string
		dst   *model.RateCurve
	}{{S3, &p.SlowRequests}, {Redis, &p.FastRequests}} {
		reads, writes := m.rates(r.store, Read), m.rates(r.store, Write)
		if len(reads)+len(writes) == 0 {
			note("%s requests: not measured, default kept", r.store)
			continue
		}
		c, ns, err := FitRates(reads, writes)
		if err != nil {
			return model.Params{}, nil, fmt.Errorf("%s requests: %w", r.store, err)
		}
		*r.dst = c
		for _, n := range ns {
			note("%s requests: %s", r.store, n)
		}
	}

	if s3r, s3w := m.bandwidth(S3, Read), m.bandwidth(S3, Write); len(s3r)+len(s3w) > 0 {
		if saturated(atSize(s3r, largestSize(s3r))) || saturated(atSize(s3w, largestSize(s3w))) {
			p.SlowServerBandwidth = m.maxAggregate(S3)
			note("s3 server bandwidth: aggregate stopped growing with workers; the largest seen, %s", FormatRate(p.SlowServerBandwidth))
		} else {
			p.SlowServerBandwidth = 0
			note("s3 server bandwidth: aggregate still growing at the most workers measured; uncapped")
		}
	}
	if v := m.maxAggregate(Redis); v > 0 {
		p.FastServerBandwidth = v
		note("redis server bandwidth: the largest aggregate seen against the shard with objects of %s or more, %s", FormatSize(BulkSize), FormatRate(v))
	}
	if pts := m.bandwidth(Pod, Read); len(pts) > 0 {
		size := largestSize(pts)
		at := atSize(pts, size)
		// the fewest pullers (one, if measured): one pod's own pull rate
		p.PodPullBandwidth = at[0].Typical()
		note("pod pull bandwidth: %d puller(s) of %s objects, %s", at[0].Workers, FormatSize(size), FormatRate(p.PodPullBandwidth))
		if saturated(at) {
			p.PodAggregateBandwidth = m.maxAggregate(Pod)
			note("pod aggregate bandwidth: stopped growing with pullers; the largest seen, %s", FormatRate(p.PodAggregateBandwidth))
		} else {
			p.PodAggregateBandwidth = 0
			note("pod aggregate bandwidth: still growing at the most pullers measured; uncapped")
		}
	}
	// The platform's CPU per store and direction: from the sidecar-path
	// points where they were measured (the real path: SDK, queue-proxy-zl,
	// server), else from the in-process measurements (bare clients: the
	// sidecar's own work missing). A producer's put into its own pod store
	// is only measured on the sidecar path (in process it is no transfer),
	// and so are deletes.
	for _, c := range []struct {
		store, op string
		dst       *model.CPUCost
	}{{S3, Write, &p.SlowCPU.Write}, {S3, Read, &p.SlowCPU.Read}, {S3, Delete, &p.SlowCPU.Delete},
		{Redis, Write, &p.FastCPU.Write}, {Redis, Read, &p.FastCPU.Read}, {Redis, Delete, &p.FastCPU.Delete},
		{Pod, Write, &p.PodCPU.Write}, {Pod, Read, &p.PodCPU.Read}} {
		pick := func(all []CPUSample) (samples []CPUSample, unseen int) {
			for _, s := range all {
				if s.Store != c.store || s.Op != c.op {
					continue
				}
				if s.ServerCPU < 0 && c.store != Pod {
					unseen++
					continue
				}
				samples = append(samples, s)
			}
			return samples, unseen
		}
		samples, unseen := pick(m.SidecarPath)
		viaSidecar := len(samples) > 0
		if !viaSidecar {
			var u int
			samples, u = pick(m.CPU)
			unseen += u
		}
		if len(samples) == 0 {
			if unseen > 0 {
				note("%s %s CPU: the server's process was not visible to calibrate; not measured (unknown)", c.store, c.op)
			}
			continue
		}
		f, err := FitCPU(samples)
		if err != nil {
			note("%s %s CPU: %v; not measured", c.store, c.op, err)
			continue
		}
		*c.dst = f.CPU
		var who string
		switch {
		case viaSidecar:
			who = fmt.Sprintf("through queue-proxy-zl: server %.0f %%, sidecars %.0f %%, SDK %.0f %%", 100*f.ServerShare, 100*f.SidecarShare, 100*(1-f.ServerShare-f.SidecarShare))
		case c.store == Pod:
			who = "bare pull client and server, both in this process"
		default:
			who = fmt.Sprintf("bare clients, no sidecar: server %.0f %%, client %.0f %%", 100*f.ServerShare, 100*(1-f.ServerShare))
		}
		note("%s %s CPU: %s + %s per request (%s); relative rms residual %.2f over %d measurements", c.store, c.op,
			FormatCPUPerByte(f.CPU.PerByte), FormatCPUSeconds(f.CPU.PerRequest), who, f.RMS, f.Samples)
	}
	// the SDKs' own share, and the control path (fitcontrol.go)
	if sdks := fitSDKs(m, note); len(sdks) > 0 {
		p.SDKCPU = sdks
	}
	if c, ok := fitControl(m, note); ok {
		p.ControlCPU = c
	}
	if err := p.Validate(); err != nil {
		return model.Params{}, nil, fmt.Errorf("fitted params: %w", err)
	}
	return p, notes, nil
}

// DescribeBandwidth prints a fitted bandwidth as a formula.
func DescribeBandwidth(b model.Bandwidth) string {
	s := FormatRate(b.PerWorker)
	if b.MemoryExponent != 0 {
		s += fmt.Sprintf("·(w/GiB)^%.2f", b.MemoryExponent)
	}
	if b.ParallelismKnee > 0 {
		s += fmt.Sprintf(" / (1+p/%.3g)^%.2f", b.ParallelismKnee, b.ParallelismExponent)
		if b.ParallelismKnee < 0.1 && b.MemoryExponent == 0 {
			// a power law: say so with its scale
			s += fmt.Sprintf(" ≈ %s·p^-%.2f", FormatRate(b.PerWorker*math.Pow(b.ParallelismKnee, b.ParallelismExponent)), b.ParallelismExponent)
		}
	}
	if b.Max > 0 {
		s += ", at most " + FormatRate(b.Max)
	}
	return s
}

// FormatSize prints a byte count in decimal units ("10 KB", "100 MB"),
// the units of Locus Table 1.
func FormatSize(b float64) string {
	for _, u := range []struct {
		n string
		v float64
	}{{"GB", model.GB}, {"MB", model.MB}, {"KB", model.KB}} {
		if b >= u.v {
			return strconv.FormatFloat(math.Round(b/u.v*100)/100, 'f', -1, 64) + " " + u.n
		}
	}
	return strconv.FormatFloat(b, 'f', -1, 64) + " B"
}

// FormatRate prints bytes per second in MB/s (or GB/s).
func FormatRate(bps float64) string {
	if bps >= 10*model.GB {
		return fmt.Sprintf("%.1f GB/s", bps/model.GB)
	}
	if bps >= 10*model.MB {
		return fmt.Sprintf("%.0f MB/s", bps/model.MB)
	}
	return fmt.Sprintf("%.2f MB/s", bps/model.MB)
}

// FormatCount prints a rate or count with three significant digits at
// most ("41200", "7.3", "0.42").
func FormatCount(v float64) string {
	switch {
	case v >= 100:
		return strconv.FormatFloat(math.Round(v), 'f', -1, 64)
	case v >= 10:
		return strconv.FormatFloat(math.Round(v*10)/10, 'f', -1, 64)
	}
	return strconv.FormatFloat(math.Round(v*100)/100, 'f', -1, 64)
}

// FormatCPUPerByte prints CPU seconds per byte as nanoseconds per byte
// (= CPU seconds per GB).
func FormatCPUPerByte(v float64) string {
	return strconv.FormatFloat(v*1e9, 'g', 3, 64) + " ns/B"
}

// FormatCPUSeconds prints a small CPU time in µs.
func FormatCPUSeconds(v float64) string {
	return strconv.FormatFloat(v*1e6, 'g', 3, 64) + " µs"
}
