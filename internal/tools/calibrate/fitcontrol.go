package calibrate

import (
	"fmt"
	"math"

	"github.com/ziptrail/ziptrail/internal/shuffle/model"
)

// fitSDKs fits each SDK's own CPU per transfer (model.Params.SDKCPU):
// "go" from the sidecar-path points' client CPU (calibrate's Go SDK
// clients: the share of SlowCPU, FastCPU and PodCPU that a job in another
// SDK does not pay), "python" from the Python points' and the control
// path's (Send: per object sent through the client; PerInvocation: per
// invocation served by the function server). Per store and direction the
// same fit as FitCPU (PerRequest·requests + PerByte·bytes, non-negative,
// on the relative residual) of the SDK process's CPU alone.
func fitSDKs(m *Measurements, note func(string, ...any)) map[string]model.SDKCost {
	out := map[string]model.SDKCost{}
	for _, sdk := range []struct {
		name    string
		samples []CPUSample
	}{{"go", m.SidecarPath}, {"python", m.PythonSDK}} {
		if len(sdk.samples) == 0 {
			continue
		}
		var c model.SDKCost
		for _, t := range []struct {
			store, op string
			dst       *model.CPUCost
			path      *model.CPUCost
		}{{S3, Write, &c.Slow.Write, &c.Path.Slow.Write}, {S3, Read, &c.Slow.Read, &c.Path.Slow.Read}, {S3, Delete, &c.Slow.Delete, &c.Path.Slow.Delete},
			{Redis, Write, &c.Fast.Write, &c.Path.Fast.Write}, {Redis, Read, &c.Fast.Read, &c.Path.Fast.Read}, {Redis, Delete, &c.Fast.Delete, &c.Path.Fast.Delete},
			{Pod, Write, &c.Pod.Write, &c.Path.Pod.Write}, {Pod, Read, &c.Pod.Read, &c.Path.Pod.Read}} {
			if sdk.name != "go" {
				// the whole path with this SDK as the client: server,
				// sidecars and its process (Go's is SlowCPU, FastCPU,
				// PodCPU), where every part was measured
				var whole []CPUSample
				for _, s := range sdk.samples {
					if s.Store == t.store && s.Op == t.op && (s.ServerCPU >= 0 || t.store == Pod) {
						whole = append(whole, s)
					}
				}
				if f, err := FitCPU(whole); err == nil {
					*t.path = f.CPU
					note("%s SDK path %s %s CPU: %s + %s per request (server, queue-proxy-zl and the %s SDK); relative rms residual %.2f over %d measurements",
						sdk.name, t.store, t.op, FormatCPUPerByte(f.CPU.PerByte), FormatCPUSeconds(f.CPU.PerRequest), sdk.name, f.RMS, f.Samples)
				}
			}
			var own []CPUSample // the SDK's process alone
			for _, s := range sdk.samples {
				if s.Store == t.store && s.Op == t.op {
					own = append(own, CPUSample{Store: s.Store, Op: s.Op, Size: s.Size, Workers: s.Workers, Requests: s.Requests, Bytes: s.Bytes,
						Seconds: s.Seconds, ServerCPU: -1, ClientCPU: s.ClientCPU})
				}
			}
			if len(own) == 0 {
				continue
			}
			f, err := FitCPU(own)
			if err != nil {
				note("%s SDK %s %s CPU: %v; not measured", sdk.name, t.store, t.op, err)
				continue
			}
			*t.dst = f.CPU
			note("%s SDK %s %s CPU: %s + %s per request (its own process); relative rms residual %.2f over %d measurements",
				sdk.name, t.store, t.op, FormatCPUPerByte(f.CPU.PerByte), FormatCPUSeconds(f.CPU.PerRequest), f.RMS, f.Samples)
		}
		if sdk.name == "python" && len(m.Control) > 0 {
			// the function servers: per object sent, per invocation
			f, err := fitPerObject(m.Control, func(s ControlSample) (float64, float64, float64) {
				return float64(s.Sends), float64(s.Invocations), s.FunctionCPU
			})
			if err != nil {
				note("python SDK send and invocation CPU: %v; not measured", err)
			} else {
				c.Send.PerRequest, c.PerInvocation = f.CPU.PerByte, f.CPU.PerRequest
				note("python SDK: %s per object sent, %s per invocation served (the function servers of the control path); relative rms residual %.2f over %d sessions",
					FormatCPUSeconds(c.Send.PerRequest), FormatCPUSeconds(c.PerInvocation), f.RMS, f.Samples)
			}
		}
		if c != (model.SDKCost{}) {
			out[sdk.name] = c
		}
	}
	return out
}

// fitControl fits the control path's CPU (model.Params.ControlCPU) to the
// control sessions: engine + sidecars + store = PerObject·objects +
// PerInvocation·invocations + PerObjectSecond·object-seconds kept, by
// least squares on the relative residual (every session weighs the
// same), each coefficient non-negative (a negative one is dropped and
// the rest refitted).
func fitControl(m *Measurements, note func(string, ...any)) (model.ControlCPU, bool) {
	var rows [][3]float64
	var y []float64
	var eng, side, store, all float64
	for _, s := range m.Control {
		if s.Platform() < minCPUSample {
			continue
		}
		rows = append(rows, [3]float64{float64(s.Objects), float64(s.Invocations), s.ObjectSeconds})
		y = append(y, s.Platform())
		eng, side, store, all = eng+s.EngineCPU, side+s.SidecarCPU, store+s.StoreCPU, all+s.Platform()
	}
	if len(rows) < 2 {
		if len(m.Control) > 0 {
			note("control path CPU: %d sessions of at least 50 ms of CPU; not measured", len(rows))
		}
		return model.ControlCPU{}, false
	}
	use := []bool{true, true, true}
	var coef [3]float64
	for {
		var cols [][]float64
		var idx []int
		for j := range use {
			if !use[j] {
				continue
			}
			col := make([]float64, len(rows))
			for i := range rows {
				col[i] = rows[i][j] / y[i]
			}
			cols, idx = append(cols, col), append(idx, j)
		}
		if len(cols) == 0 {
			note("control path CPU: no non-negative fit; not measured")
			return model.ControlCPU{}, false
		}
		x, ok := leastSquares(cols, ones(len(rows)))
		if !ok {
			note("control path CPU: the sessions do not tell the costs apart; not measured")
			return model.ControlCPU{}, false
		}
		neg := -1
		for k, v := range x {
			if v < 0 && (neg < 0 || v < x[neg]) {
				neg = k
			}
		}
		if neg < 0 {
			coef = [3]float64{}
			for k, j := range idx {
				coef[j] = x[k]
			}
			break
		}
		use[idx[neg]] = false
	}
	var ss float64
	for i := range rows {
		r := (coef[0]*rows[i][0]+coef[1]*rows[i][1]+coef[2]*rows[i][2])/y[i] - 1
		ss += r * r
	}
	c := model.ControlCPU{PerObject: coef[0], PerInvocation: coef[1], PerObjectSecond: coef[2], MaxCores: m.CheckpointMaxShare}
	note("control path CPU: %s per object announced + %s per invocation + %s per object kept per second (engine %.0f %%, sidecars %.0f %%, redis %.0f %%; idle use subtracted: %.3f cores engine, %.3f sidecars, %.3f redis); relative rms residual %.2f over %d sessions",
		FormatCPUSeconds(c.PerObject), FormatCPUSeconds(c.PerInvocation), FormatCPUSeconds(c.PerObjectSecond), 100*eng/all, 100*side/all, 100*store/all,
		m.Control[0].IdleCores[0], m.Control[0].IdleCores[1], m.Control[0].IdleCores[2], math.Sqrt(ss/float64(len(rows))), len(rows))
	return c, true
}

// fitPerObject fits cpu = perObject·objects + perInvocation·invocations
// with FitCPU (objects as its bytes, invocations as its requests).
func fitPerObject(samples []ControlSample, f func(ControlSample) (objects, invocations, cpu float64)) (CPUFit, error) {
	var cs []CPUSample
	for _, s := range samples {
		o, i, c := f(s)
		cs = append(cs, CPUSample{Requests: int(i), Bytes: o, ServerCPU: -1, ClientCPU: c, Seconds: s.Seconds})
	}
	fit, err := FitCPU(cs)
	if err != nil {
		return fit, fmt.Errorf("%w (sessions of too little CPU)", err)
	}
	return fit, nil
}
