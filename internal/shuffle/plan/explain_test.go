package plan

import (
	"strings"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/shuffle/model"
)

func TestDecodeRequest(t *testing.T) {
	in, prices, err := DecodeRequest([]byte(`{"dataBytes": 4294967296, "fastCapacity": 1073741824, "deadline": 600,
		"methods": ["s3", "hybrid"], "prices": {"slowPerPut": 0.00001}}`))
	if err != nil {
		t.Fatal(err)
	}
	if in.MaxWorkerMemory != DefaultMaxWorkerMemory || len(in.Methods) != 2 || in.Deadline != 600 {
		t.Errorf("input %+v", in)
	}
	def := model.DefaultPrices()
	if prices.SlowPerPut != 0.00001 || prices.SlowPerGet != def.SlowPerGet {
		t.Errorf("prices %+v: want slowPerPut overridden, the rest default", prices)
	}
	ex, err := Explain(model.DefaultCalibration(), prices, in)
	if err != nil {
		t.Fatal(err)
	}
	if ex.Calibrated || ex.Result.Input.Objective != Cheapest {
		t.Errorf("calibrated %v, objective %q: want the defaults, and a deadline alone to mean cheapest", ex.Calibrated, ex.Result.Input.Objective)
	}
	if len(ex.Result.Options) != 2 {
		t.Errorf("%d options, want the 2 methods asked for", len(ex.Result.Options))
	}
}

func TestDecodeRequestRefuses(t *testing.T) {
	for _, c := range []struct{ body, want string }{
		{`{"dataBytes": -1}`, "data size must be positive"},
		{`{"dataBytes": 0}`, "data size must be positive"},
		{`{"dataBytes": 1e300}`, "at most 1"},
		{`{"dataBytes": 1e9, "methods": ["tape"]}`, `unknown method "tape"`},
		{`{"dataBytes": 1e9, "budget": 1, "deadline": 60}`, "not both"},
		{`{"dataBytes": 1e9, "fastCapacity": -5}`, "must not be negative"},
		{`{"dataBytes": 1e9, "maxParallelism": -5}`, "must not be negative"},
		{`{"dataBytes": 1e9, "maxParallelism": 1000000000}`, "at most"},
		{`{"dataBytes": 1e9, "maxWorkerMemory": 1e20}`, "at most"},
		{`{"dataBytes": 1e18, "fastCapacity": 1}`, "hybrid rounds"},
		{`{"dataBytes": 1e9, "objective": "slowest"}`, "unknown objective"},
		{`{"dataBytes": 1e9, "sise": 5}`, "unknown field"},
		{`{"dataBytes": 1e9, "prices": {"slowPerPut": -1}}`, "non-negative"},
		{`{"dataBytes": 1e9, "prices": {"gold": 1}}`, "unknown field"},
		{`{"dataBytes": "1GiB"}`, "cannot unmarshal"},
		{`{"dataBytes": 1e9} {"dataBytes": 1}`, "after its JSON object"},
		{`{"dataBytes": 1e9`, "not valid JSON"},
		{``, "not valid JSON"},
	} {
		in, prices, err := DecodeRequest([]byte(c.body))
		if err == nil {
			// Plan refuses what DecodeRequest lets through (the objective).
			_, err = Explain(model.DefaultCalibration(), prices, in)
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.body, err, c.want)
		}
	}
}

// The largest Input within the bounds is still a bounded amount of work.
func TestLargestInputIsBounded(t *testing.T) {
	in := Input{DataBytes: MaxDataBytes, FastCapacity: MaxDataBytes / MaxRounds, MaxWorkerMemory: MaxWorkerMemoryCap, MaxParallelism: MaxParallelismCap}
	start := time.Now()
	res, err := Plan(defaultModel(t), in)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, o := range res.Options {
		n += o.Evaluated
	}
	t.Logf("%d configurations in %v", n, time.Since(start))
	if n > 200_000 {
		t.Errorf("%d configurations evaluated: the bounds let one request cost too much", n)
	}
}

// FuzzDecodeRequest plays a careless or hostile client of the gateway's
// plan route: whatever the body, decoding and planning return an answer
// or an error, never panic, and stay bounded work.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{
		`{"dataBytes": 4294967296, "fastCapacity": 1073741824, "budget": 0.5}`,
		`{"dataBytes": 1e9, "minWorkerMemory": 1, "maxWorkerMemory": 2}`,
		`{"dataBytes": 1152921504606846976, "fastCapacity": 1099511627776, "maxWorkerMemory": 1099511627776, "maxParallelism": 1048576}`,
		`{"dataBytes": 1, "podMemory": 1e-300, "deadline": 1e-300, "methods": ["hybrid", "hybrid"]}`,
		`{"dataBytes": 1e9, "prices": {"workerPerGiBSecond": 1e308, "slowPerGet": 1e308}}`,
		`{"dataBytes": 5e-324, "fastCapacity": 5e-324}`,
	} {
		f.Add([]byte(s))
	}
	cal := model.DefaultCalibration()
	f.Fuzz(func(t *testing.T, body []byte) {
		in, prices, err := DecodeRequest(body)
		if err != nil {
			return
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = Explain(cal, prices, in)
		}()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: still planning after 5 s", body)
		}
	})
}
