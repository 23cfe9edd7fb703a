// Command fn is the batched stream sample's functions, one binary with three
// roles (the first argument):
//
//	ingest     sensor readings (the session input, "sensor,value" lines) ->
//	           one object per reading in bucket "readings"
//	summarize  a batch of BATCH readings (a ByBatchSize trigger fires for
//	           every BATCH objects) -> min, max, mean in bucket "summaries"
//	report     every summary (a DynamicJoin trigger: ingest declares how
//	           many batches there are) -> the report in bucket "output"
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"math"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"

	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// batch must match the ByBatchSize trigger's size in workflow.yaml.
const batch = 4

// Summary describes one batch.
type Summary struct {
	First string  `json:"first"`
	Count int     `json:"count"`
	Min   float64 `json:"min"`
	Max   float64 `json:"max"`
	Mean  float64 `json:"mean"`
}

func ingest(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
	var lines []string
	for _, l := range strings.Split(string(inv.Objects[0].Bytes()), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	// A stream never ends, so a partial batch waits for more readings;
	// a session is complete once every full batch is summarized.
	batches := len(lines) / batch
	if batches == 0 {
		return nil, fmt.Errorf("need at least %d readings, got %d", batch, len(lines))
	}
	meta := map[string]string{"batches": strconv.Itoa(batches)}
	for i, l := range lines[:batches*batch] {
		if err := ziptrail.SendObject(ctx, "readings", fmt.Sprintf("r-%05d", i), []byte(l), meta); err != nil {
			return nil, err
		}
	}
	return nil, nil
}

func summarize(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
	s := Summary{Min: math.Inf(1), Max: math.Inf(-1)}
	keys := make([]string, 0, len(inv.Objects))
	sum := 0.0
	for _, o := range inv.Objects {
		_, v, ok := strings.Cut(string(o.Bytes()), ",")
		x, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if !ok || err != nil {
			return nil, fmt.Errorf("reading %s: want sensor,value: %q", o.Key, o.Bytes())
		}
		s.Min, s.Max, sum = math.Min(s.Min, x), math.Max(s.Max, x), sum+x
		keys = append(keys, o.Key)
	}
	sort.Strings(keys)
	s.First, s.Count, s.Mean = keys[0], len(keys), sum/float64(len(keys))
	out, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	// The DynamicJoin downstream waits for as many summaries as ingest declared.
	return nil, ziptrail.SendObject(ctx, "summaries", "batch-"+s.First, out,
		map[string]string{"ziptrail.expected-count": inv.Objects[0].Metadata["batches"]})
}

func report(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
	var all []Summary
	for _, o := range inv.Objects {
		var s Summary
		if err := json.Unmarshal(o.Bytes(), &s); err != nil {
			return nil, err
		}
		all = append(all, s)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].First < all[j].First })
	out, err := json.Marshal(map[string]any{"batches": len(all), "summaries": all})
	if err != nil {
		return nil, err
	}
	return nil, ziptrail.SendObject(ctx, "output", "result", out, nil)
}

func main() {
	roles := map[string]ziptrail.Handler{"ingest": ingest, "summarize": summarize, "report": report}
	if len(os.Args) != 2 || roles[os.Args[1]] == nil {
		log.Fatalf("usage: fn ingest|summarize|report")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := ziptrail.Serve(ctx, roles[os.Args[1]]); err != nil {
		log.Fatal(err)
	}
}
