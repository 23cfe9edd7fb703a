package engine

import (
	"fmt"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"
)

func benchEngine(b *testing.B, triggers ...TriggerSpec) *Engine {
	e := New(64)
	if err := e.SetWorkflow(WorkflowSpec{Name: wfName, Entry: "entry", OutputBucket: "out", SessionDeadline: time.Hour, Triggers: triggers}); err != nil {
		b.Fatal(err)
	}
	return e
}

// BenchmarkObjectReadyDecision measures object-ready -> invocation decision
// latency (p50/p99 of individually timed events) and throughput, with 1,000
// concurrent sessions. Run with -cpu 1 for the single-core figure.
func BenchmarkObjectReadyDecision(b *testing.B) {
	e := benchEngine(b, TriggerSpec{Name: "t", Bucket: "b", Primitive: Immediate, Targets: []string{"next"}})
	const sessions = 1000
	for i := 0; i < sessions; i++ {
		if _, err := e.StartSession(wfName, "s"+strconv.Itoa(i), Object{}, t0); err != nil {
			b.Fatal(err)
		}
	}
	objs := make([]Object, 4096)
	for i := range objs {
		objs[i] = Object{Bucket: "b", Session: "s" + strconv.Itoa(i%sessions), Size: 10 << 10, Ref: "zt1.ref"}
	}
	lat := make([]time.Duration, 0, min(b.N, 1<<20))
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		o := objs[i%len(objs)]
		o.Key = strconv.Itoa(i)
		t := time.Now()
		acts := e.ObjectReady(wfName, o, t0)
		if len(lat) < cap(lat) {
			lat = append(lat, time.Since(t))
		}
		if len(acts) != 1 {
			b.Fatalf("fired %d", len(acts))
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
}

// BenchmarkFanOut4096 decides a 4,096-way fan-out: 4,096 objects of one
// session, each invoking a function (Pheromone's 4k parallel functions).
func BenchmarkFanOut4096(b *testing.B) {
	const n = 4096
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		e := benchEngine(b, TriggerSpec{Name: "t", Bucket: "b", Primitive: Immediate, Targets: []string{"worker"}})
		if _, err := e.StartSession(wfName, "s", Object{}, t0); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		fired := 0
		for k := 0; k < n; k++ {
			fired += len(e.ObjectReady(wfName, Object{Bucket: "b", Key: strconv.Itoa(k), Session: "s"}, t0))
		}
		if fired != n {
			b.Fatalf("fired %d", fired)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1e3, "ms/fanout")
}

// BenchmarkChain1000 runs a 1,000-function chain through the engine alone:
// each function's output object invokes the next one.
func BenchmarkChain1000(b *testing.B) {
	const n = 1000
	triggers := make([]TriggerSpec, n)
	for i := range triggers {
		triggers[i] = TriggerSpec{Name: fmt.Sprintf("t%d", i), Bucket: fmt.Sprintf("b%d", i), Primitive: Immediate, Targets: []string{fmt.Sprintf("f%d", i+1)}}
	}
	e := benchEngine(b, triggers...)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s := "s" + strconv.Itoa(i)
		if _, err := e.StartSession(wfName, s, Object{}, t0); err != nil {
			b.Fatal(err)
		}
		for k := 0; k < n; k++ {
			acts := e.ObjectReady(wfName, Object{Bucket: "b" + strconv.Itoa(k), Key: "o", Session: s}, t0)
			if len(acts) != 1 {
				b.Fatalf("step %d fired %d", k, len(acts))
			}
		}
		e.ObjectReady(wfName, Object{Bucket: "out", Key: "r", Session: s}, t0)
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1e3, "ms/chain")
}

// TestConcurrentProducers runs many goroutines feeding their own sessions
// at once (run with -race): no lost or duplicated firing.
func TestConcurrentProducers(t *testing.T) {
	e := single(t, TriggerSpec{Name: "t", Bucket: "b", Primitive: ByBatchSize, BatchSize: 10, Targets: []string{"f"}})
	const workers, perWorker, sessionsPer = 8, 2000, 5
	var wg sync.WaitGroup
	counts := make([]int, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := 0; s < sessionsPer; s++ {
				if _, err := e.StartSession(wfName, fmt.Sprintf("w%d-s%d", w, s), Object{}, t0); err != nil {
					t.Error(err)
					return
				}
			}
			for i := 0; i < perWorker; i++ {
				sess := fmt.Sprintf("w%d-s%d", w, i%sessionsPer)
				for _, a := range e.ObjectReady(wfName, Object{Bucket: "b", Key: strconv.Itoa(i), Session: sess}, t0) {
					counts[w] += len(a.Objects)
				}
				if i%100 == 0 {
					e.Tick(t0)
					_ = e.Snapshot()
				}
			}
		}()
	}
	wg.Wait()
	for w, c := range counts {
		if c != perWorker {
			t.Errorf("worker %d: %d objects fired, want %d", w, c, perWorker)
		}
	}
}

// BenchmarkShuffle4096 closes a 4,096-mapper DynamicGroup: each mapper
// starts, sends one output and finishes; the last finish fires the groups.
func BenchmarkShuffle4096(b *testing.B) {
	const n = 4096
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		e := benchEngine(b, TriggerSpec{Name: "t", Bucket: "shuffle", Primitive: DynamicGroup, Sources: []string{"map"}, Targets: []string{"reduce"}})
		if _, err := e.StartSession(wfName, "s", Object{}, t0); err != nil {
			b.Fatal(err)
		}
		e.FunctionFinished(wfName, "s", "entry", "s.0", false, t0)
		for k := 0; k < n; k++ {
			e.FunctionStarted(wfName, "s", "map", "s.m"+strconv.Itoa(k), nil, t0)
		}
		b.StartTimer()
		fired := 0
		for k := 0; k < n; k++ {
			inv := "s.m" + strconv.Itoa(k)
			e.ObjectReady(wfName, Object{Bucket: "shuffle", Key: strconv.Itoa(k), Session: "s", Invocation: inv, Producer: "map",
				Metadata: map[string]string{"group": strconv.Itoa(k % 64)}}, t0)
			fired += len(e.FunctionEnded(wfName, "s", "map", inv, Finish{Outputs: 1}, t0))
		}
		if fired != 64 {
			b.Fatalf("fired %d groups", fired)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1e3, "ms/shuffle")
}

// BenchmarkObjectReadyDelegated is BenchmarkObjectReadyDecision with
// delegation on: every object comes with the producer's report that it
// fired the target itself, so the decision only records the firing.
func BenchmarkObjectReadyDelegated(b *testing.B) {
	e := New(64)
	if err := e.SetWorkflow(WorkflowSpec{Name: wfName, Entry: "entry", OutputBucket: "out", SessionDeadline: time.Hour, Delegate: true,
		Triggers: []TriggerSpec{{Name: "t", Bucket: "b", Primitive: Immediate, Targets: []string{"next"}}}}); err != nil {
		b.Fatal(err)
	}
	const sessions = 1000
	entries := make([]string, sessions)
	for i := 0; i < sessions; i++ {
		acts, err := e.StartSession(wfName, "s"+strconv.Itoa(i), Object{}, t0)
		if err != nil {
			b.Fatal(err)
		}
		entries[i] = acts[0].Invocation
	}
	objs := make([]Object, 4096)
	for i := range objs {
		s := "s" + strconv.Itoa(i%sessions)
		objs[i] = Object{Bucket: "b", Key: strconv.Itoa(i), Session: s, Size: 10 << 10, Ref: "zt1.ref", Invocation: entries[i%sessions]}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		o := objs[i%len(objs)]
		o.Key = strconv.Itoa(i)
		o.FiredLocally = []string{DelegatedInvocation(o.Session, "t", "next", "b", o.Key)}
		acts := e.ObjectReady(wfName, o, t0)
		if len(acts) != 1 || !acts[0].Delegated {
			b.Fatalf("got %v", acts)
		}
	}
}
