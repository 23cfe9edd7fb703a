package plan

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/ziptrail/ziptrail/internal/shuffle/model"
)

// Explanation is a plan with what it was computed from: the document of
// `ziptrail explain -o json` and of the session gateway's plan route
// (POST /v1/namespaces/{ns}/shuffle/plan), which the SDKs' plan calls read.
type Explanation struct {
	// Calibrated is false when the built-in defaults were used.
	Calibrated  bool              `json:"calibrated"`
	Calibration model.Calibration `json:"calibration"`
	Prices      model.Prices      `json:"prices"`
	Result      Result            `json:"result"`
}

// Explain plans in with the calibration's parameters and the prices.
func Explain(cal model.Calibration, prices model.Prices, in Input) (Explanation, error) {
	m, err := model.New(cal.Params, prices)
	if err != nil {
		return Explanation{}, err
	}
	res, err := Plan(m, in)
	if err != nil {
		return Explanation{}, err
	}
	return Explanation{Calibrated: cal.Calibrated(), Calibration: cal, Prices: prices, Result: res}, nil
}

// DefaultMaxWorkerMemory is the largest worker memory considered when a
// Request names none (`ziptrail explain --worker-memory`'s default).
const DefaultMaxWorkerMemory = 3 * model.GiB

// Request is a plan asked for over the wire (the session gateway's plan
// route): the Input's fields, and prices overriding some or all of the
// defaults (fields of model.Prices).
type Request struct {
	Input
	Prices json.RawMessage `json:"prices,omitempty"`
}

// DecodeRequest reads a Request from JSON, strictly: unknown fields,
// trailing data and invalid values are errors that say what is wrong (a
// caller shows them to the user as they are). A zero MaxWorkerMemory
// becomes DefaultMaxWorkerMemory.
func DecodeRequest(data []byte) (Input, model.Prices, error) {
	var req Request
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return Input{}, model.Prices{}, fmt.Errorf("the plan request is not valid JSON of the expected shape: %v", err)
	}
	if dec.More() {
		return Input{}, model.Prices{}, errors.New("the plan request has data after its JSON object")
	}
	prices, err := PricesWith(model.DefaultPrices(), req.Prices)
	if err != nil {
		return Input{}, model.Prices{}, err
	}
	in := req.Input
	if in.MaxWorkerMemory == 0 {
		in.MaxWorkerMemory = max(DefaultMaxWorkerMemory, in.MinWorkerMemory)
	}
	if err := in.Check(); err != nil {
		return Input{}, model.Prices{}, err
	}
	return in, prices, nil
}

// PricesWith returns base with the fields of the JSON object overrides
// (fields of model.Prices; unknown fields are an error) replacing its own.
func PricesWith(base model.Prices, overrides []byte) (model.Prices, error) {
	if len(bytes.TrimSpace(overrides)) == 0 || string(bytes.TrimSpace(overrides)) == "null" {
		return base, nil
	}
	dec := json.NewDecoder(bytes.NewReader(overrides))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&base); err != nil {
		return model.Prices{}, fmt.Errorf("prices: %v", err)
	}
	if err := base.Validate(); err != nil {
		return model.Prices{}, fmt.Errorf("prices: %w", err)
	}
	return base, nil
}

// Bounds of an Input, so that one plan stays a bounded amount of work
// (the search is exhaustive over a grid whose size grows with the
// logarithms of these, and with the hybrid's number of rounds).
const (
	MaxDataBytes       = float64(1 << 60) // 1 EiB
	MaxWorkerMemoryCap = float64(1 << 40) // 1 TiB
	MaxParallelismCap  = 1 << 20
	// MaxRounds bounds the hybrid's fewest rounds, ⌈D/F⌉.
	MaxRounds = 1 << 20
)

// ParseMethods reads a comma-separated list of methods.
func ParseMethods(s string) ([]model.Method, error) {
	var out []model.Method
	for _, part := range strings.Split(s, ",") {
		m := model.Method(strings.TrimSpace(part))
		if !slices.Contains(model.Methods, m) {
			return nil, unknownMethod(m)
		}
		out = append(out, m)
	}
	return out, nil
}

func unknownMethod(m model.Method) error {
	names := make([]string, len(model.Methods))
	for i, k := range model.Methods {
		names[i] = string(k)
	}
	return fmt.Errorf("unknown method %q (want one of %s)", m, strings.Join(names, ", "))
}

// Check says what is wrong with in before planning it, in words for the
// user: Plan checks the same (and Check is what it calls).
func (in Input) Check() error {
	switch {
	case !(in.DataBytes > 0) || in.DataBytes > MaxDataBytes:
		return fmt.Errorf("the data size must be positive and at most %s", model.FormatBytes(MaxDataBytes))
	case in.Budget > 0 && in.Deadline > 0:
		return errors.New("give a budget (the fastest plan within it) or a deadline (the cheapest plan within it), not both")
	case !(in.FastCapacity >= 0) || !(in.PodMemory >= 0) || !(in.Budget >= 0) || !(in.Deadline >= 0) || !(in.MinWorkerMemory >= 0) || in.MaxParallelism < 0:
		return errors.New("sizes, parallelism, budget and deadline must not be negative")
	case in.MaxWorkerMemory > MaxWorkerMemoryCap:
		return fmt.Errorf("the worker memory limit must be at most %s", model.FormatBytes(MaxWorkerMemoryCap))
	case in.MaxParallelism > MaxParallelismCap:
		return fmt.Errorf("the maximum parallelism must be at most %d", MaxParallelismCap)
	case in.FastCapacity > 0 && in.DataBytes/in.FastCapacity > MaxRounds:
		return fmt.Errorf("the fast tier (%s) is too small for %s: more than %d hybrid rounds", model.FormatBytes(in.FastCapacity), model.FormatBytes(in.DataBytes), MaxRounds)
	}
	for _, m := range in.Methods {
		if !slices.Contains(model.Methods, m) {
			return unknownMethod(m)
		}
	}
	return nil
}
