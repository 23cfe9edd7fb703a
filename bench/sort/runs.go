package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ziptrail/ziptrail/internal/localcluster"
	"github.com/ziptrail/ziptrail/internal/shuffle/model"
)

// runner is what every run of one bench invocation shares: the cluster,
// the model, the report it adds each run to.
type runner struct {
	o            options
	ctx          context.Context
	c            *localcluster.Cluster
	rdb          *redis.Client
	m            *model.Model
	cal          *model.Calibration
	compute      model.Compute
	podMemPerPod int64
	maxRounds    int
	rayPython    string
	examples     string
	rep          *Report
	write        func() // saves the report so far
	step, total  int
}

// sizeRun is one data size's settings, the same for every method.
type sizeRun struct {
	size, records, taskRecords, fastCap, roundCap int64
	parts                                         int
}

func newSizeRun(o options, size int64) sizeRun {
	records := size / 100
	return sizeRun{size: size, records: records,
		parts:       int(max(4, size/partitionBytes)),
		taskRecords: min(o.taskBytes/100, max(1, records/4)),
		fastCap:     int64(math.Floor(o.fastFraction * float64(size))),
		roundCap:    int64(math.Floor(o.roundFrac * float64(size)))}
}

// ziptrail runs one sort through the cluster with method, predicted
// first; it returns the run as stored in the report when it completed
// (nil when skipped or failed). first is the size's first completed run,
// whose output this one's must equal.
func (rn *runner) ziptrail(sz sizeRun, method string, first *Run) (*Run, error) {
	o, ctx, rdb := rn.o, rn.ctx, rn.rdb
	rn.step++
	step, total := rn.step, rn.total
	r := Run{System: "ziptrail", Method: method, Bytes: sz.records * 100, Records: sz.records, Partitions: sz.parts,
		FastCap: sz.fastCap, LoadBefore: loadavg()}
	rounds := 1
	if method == "hybrid" {
		rounds = int(math.Ceil(float64(sz.records*100) / float64(sz.roundCap)))
		r.Rounds = rounds
	}
	r.MapTasks = mapTasks(sz.records, sz.taskRecords, rounds)
	cfg := model.Config{Method: model.Method(method), DataBytes: float64(r.Bytes), Parallelism: workers,
		WorkerMemory: float64(rn.podMemPerPod) / rn.cal.Params.PodStoreFraction, FastCapacity: float64(sz.fastCap),
		MapTasks: r.MapTasks, Partitions: sz.parts, Compute: rn.compute, SDK: sortSDK}
	if method == "hybrid" {
		cfg.RoundBytes = float64(sz.roundCap)
	}
	pred, perr := rn.m.Predict(cfg)
	cfg.Compute = model.Compute{}
	predIO, _ := rn.m.Predict(cfg)
	switch {
	case method == "redis" && r.Bytes > sz.fastCap:
		r.Skipped = fmt.Sprintf("%s does not fit in the fast tier's cap of %s (%.0f %% of the data)", human(r.Bytes), human(sz.fastCap), 100*o.fastFraction)
	case method == "hybrid" && rounds > rn.maxRounds:
		r.Skipped = fmt.Sprintf("%d rounds: the workflow declares %d", rounds, rn.maxRounds)
	case method == "podmemory" && 2*r.Bytes > workers*rn.podMemPerPod:
		// The model's check (D ≤ P·memoryLimitPerPod) would allow up to
		// 4 GiB; Knative does not spread the map tasks evenly over the 8
		// pods, so a pod's object store must have room for twice its share.
		r.Skipped = fmt.Sprintf("%s does not fit in half of the map pods' object stores (%d pods × %s memoryLimitPerPod; uneven placement needs the headroom)",
			human(r.Bytes), workers, human(rn.podMemPerPod))
	case perr != nil:
		r.Skipped = perr.Error()
	}
	if perr == nil {
		r.Predicted, r.PredictedNoCPU, r.Prediction = pred.Seconds, predIO.Seconds, &pred
	}
	if r.Skipped != "" {
		logf("[%d/%d] %s via %s: skipped: %s", step, total, human(r.Bytes), method, r.Skipped)
		rn.add(r)
		return nil, nil
	}
	params := map[string]any{"method": method, "bytes": r.Bytes, "seed": o.seed, "partitions": sz.parts,
		"taskRecords": sz.taskRecords, "job": fmt.Sprintf("sort%d%s", sz.size/MiB, method)}
	if method == "hybrid" {
		params["fastCapacity"] = sz.roundCap
	}
	// The fast tier's cap: what Redis holds already (the engine's
	// checkpoint, earlier sessions' leftovers) plus the cap.
	used := redisUsed(ctx, rdb)
	if err := rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		return nil, err
	}
	if err := rdb.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used+sz.fastCap, 10)).Err(); err != nil {
		return nil, err
	}
	logf("[%d/%d] %s via %s: started (%d partitions, %d map tasks, %d round(s); Redis maxmemory %s = %s in use + cap %s; predicted %s, %s without the compute term; load %s)",
		step, total, human(r.Bytes), method, sz.parts, r.MapTasks, rounds, human(used+sz.fastCap), human(used), human(sz.fastCap),
		fmtSec(r.Predicted), fmtSec(r.PredictedNoCPU), r.LoadBefore)
	peak := int64(0)
	stop := watchRedis(ctx, rdb, &peak)
	invoked := newInvocationLog()
	sampler := sampleCPU(time.Second)
	res, s, err := session(rn.c.GatewayURL, rn.c.GatewayToken, params, o.timeout, func(el time.Duration, what string) {
		logf("[%d/%d] %s via %s: running, %s elapsed (Redis %s used; %s)", step, total, human(r.Bytes), method, el.Round(time.Second), human(redisUsed(ctx, rdb)), what)
	}, invoked.add)
	stop()
	samples := sampler.stop()
	r.Functions, r.MissedEvents = invoked.times()
	r.PeakRedisMemory = peak - used
	r.LoadAfter = loadavg()
	_ = rdb.ConfigSet(ctx, "maxmemory", "0").Err()
	if err != nil {
		r.Failed = err.Error()
		logf("[%d/%d] %s via %s: FAILED: %v", step, total, human(r.Bytes), method, err)
		rn.add(r)
		return nil, nil
	}
	var v struct {
		Valid           bool    `json:"valid"`
		SHA256          string  `json:"sha256"`
		Rounds          int     `json:"rounds"`
		ValidateSeconds float64 `json:"validateSeconds"`
	}
	_ = json.Unmarshal(res, &v)
	r.Result, r.Valid, r.SHA256, r.ValidateSeconds = res, v.Valid, v.SHA256, v.ValidateSeconds
	r.Seconds = s.Ended.Sub(s.Started).Seconds()
	r.SortSeconds = r.Seconds - r.ValidateSeconds
	r.Rounds = max(r.Rounds, v.Rounds)
	r.CPU = cpuWindows(samples, s.Started, r.Functions, r.SortSeconds)
	if r.Predicted > 0 {
		e := 100 * (r.Predicted - r.SortSeconds) / r.SortSeconds
		r.ErrorPct = &e
	}
	if first != nil {
		same := r.SHA256 == first.SHA256
		r.SameOutput = &same
	}
	logf("[%d/%d] %s via %s: done in %s (sort %s + validation %s), valid %v, sha256 %.12s…; predicted %s (%+.0f %%); peak Redis +%s; load %s",
		step, total, human(r.Bytes), method, fmtSec(r.Seconds), fmtSec(r.SortSeconds), fmtSec(r.ValidateSeconds), r.Valid, r.SHA256,
		fmtSec(r.Predicted), deref(r.ErrorPct), human(r.PeakRedisMemory), r.LoadAfter)
	return rn.add(r), nil
}

// ray runs the same sort on Ray; first is the size's first completed
// ziptrail run, whose output Ray's must equal.
func (rn *runner) ray(sz sizeRun, first *Run) {
	rn.step++
	step, total := rn.step, rn.total
	r := Run{System: "ray", Method: "ray", Bytes: sz.records * 100, Records: sz.records, Partitions: sz.parts,
		MapTasks: mapTasks(sz.records, sz.taskRecords, 1), FastCap: sz.fastCap, LoadBefore: loadavg()}
	logf("[%d/%d] %s via Ray (object store %s, 2 CPUs): started (load %s)", step, total, human(r.Bytes), human(sz.fastCap), r.LoadBefore)
	res, err := rayRun(rn.rayPython, rn.examples, rn.o.seed, sz.records, sz.parts, sz.taskRecords, sz.fastCap, rn.o.timeout)
	r.LoadAfter = loadavg()
	if err != nil {
		r.Failed = err.Error()
		logf("[%d/%d] %s via Ray: FAILED: %v", step, total, human(r.Bytes), err)
		rn.add(r)
		return
	}
	var v struct {
		Valid           bool    `json:"valid"`
		SHA256          string  `json:"sha256"`
		Seconds         float64 `json:"seconds"`
		SortSeconds     float64 `json:"sortSeconds"`
		ValidateSeconds float64 `json:"validateSeconds"`
	}
	_ = json.Unmarshal(res, &v)
	r.Result, r.Valid, r.SHA256 = res, v.Valid, v.SHA256
	r.Seconds, r.SortSeconds, r.ValidateSeconds = v.Seconds, v.SortSeconds, v.ValidateSeconds
	if first != nil {
		same := r.SHA256 == first.SHA256
		r.SameOutput = &same
	}
	logf("[%d/%d] %s via Ray: done in %s (sort %s + validation %s), valid %v, sha256 %.12s…, same as ziptrail's: %v; load %s",
		step, total, human(r.Bytes), fmtSec(r.Seconds), fmtSec(r.SortSeconds), fmtSec(r.ValidateSeconds), r.Valid, r.SHA256,
		r.SameOutput != nil && *r.SameOutput, r.LoadAfter)
	rn.add(r)
}

// add stores a run in the report, saves the report, and returns the
// stored run.
func (rn *runner) add(r Run) *Run {
	rn.rep.Runs = append(rn.rep.Runs, r)
	rn.write()
	return &rn.rep.Runs[len(rn.rep.Runs)-1]
}

// printReport prints every table of the report; withCPU adds the
// per-process CPU table (a re-prediction's).
func printReport(w io.Writer, rep *Report, withCPU bool) {
	printTable(w, rep)
	if withCPU {
		printCPU(w, rep)
	}
	printPhases(w, rep)
	printWindows(w, rep)
	printPhaseCPU(w, rep)
}
