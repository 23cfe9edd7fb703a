package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/ziptrail/ziptrail/internal/operator/gateway/gatewayv1"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// Shuffle methods a plan chooses from (docs/shuffle.md).
const (
	MethodS3        = "s3"
	MethodRedis     = "redis"
	MethodPodMemory = "podmemory"
	MethodHybrid    = "hybrid"
)

// PlanRequest describes a shuffle to plan: its size, the storage it may
// use, the limits of its workers and the objective. Sizes are bytes.
type PlanRequest struct {
	// Size is the number of bytes to shuffle (required).
	Size int64
	// FastCapacity is the fast tier's (Redis's) memory the shuffle may use;
	// 0: no fast tier.
	FastCapacity int64
	// PodMemory caps what the producer pods' object stores hold together;
	// 0: only each pod's own memory limits it.
	PodMemory int64
	// MinWorkerMemory and MaxWorkerMemory bound the worker memory
	// considered (defaults 128 MiB and 3 GiB).
	MinWorkerMemory, MaxWorkerMemory int64
	// MaxParallelism bounds the workers running at once (default 1024).
	MaxParallelism int
	// Objective is "fastest" (within Budget) or "cheapest" (within
	// Deadline); empty: cheapest with a Deadline, else fastest.
	Objective string
	// Budget in US dollars, or Deadline: one of them at most.
	Budget   float64
	Deadline time.Duration
	// Methods to consider (MethodS3, …; empty: all).
	Methods []string
	// Prices override some of the planner's prices, by their JSON names
	// (workerPerGiBSecond, slowPerGet, slowPerPut, slowPerGiBMonth,
	// fastPerGiBHour, fastPerNodeHour, fastPerGiBTransferred; docs/shuffle-model.md).
	Prices map[string]float64
}

// PlanOption is one method's best plan.
type PlanOption struct {
	Method       string
	Parallelism  int
	WorkerMemory int64
	// Rounds and RoundBytes are the hybrid's rounds (0 for the others).
	Rounds     int
	RoundBytes int64
	// Seconds and Dollars are the model's predictions.
	Seconds, Dollars float64
	// Feasible is false when the method cannot run this shuffle at all
	// (Reason says why; the numbers are zero).
	Feasible bool
	// MeetsConstraint says whether it is within the budget or deadline.
	MeetsConstraint bool
	Reason          string
}

// Plan is the planner's answer: the chosen method and its configuration,
// every method's best for comparison, and whether the predictions come
// from this installation's calibration.
type Plan struct {
	// Chosen is the best plan meeting the constraint; nil when none does
	// (Reason says why).
	Chosen *PlanOption
	Reason string
	// Alternatives are every considered method's best, the chosen one
	// included (in the order s3, redis, podmemory, hybrid).
	Alternatives []PlanOption
	// Calibrated is false when the cluster has no calibration (`ziptrail
	// calibrate --configmap`) and the built-in defaults were used;
	// Warning says why when a calibration exists but could not be used.
	Calibrated bool
	Warning    string
	// Document is the whole answer: the JSON document of `ziptrail
	// explain -o json` (phases, costs, the calibration, the prices).
	Document json.RawMessage
}

// planRequest is the gateway's request document (plan.Request).
type planRequest struct {
	DataBytes       float64            `json:"dataBytes"`
	FastCapacity    float64            `json:"fastCapacity,omitempty"`
	PodMemory       float64            `json:"podMemory,omitempty"`
	MinWorkerMemory float64            `json:"minWorkerMemory,omitempty"`
	MaxWorkerMemory float64            `json:"maxWorkerMemory,omitempty"`
	MaxParallelism  int                `json:"maxParallelism,omitempty"`
	Objective       string             `json:"objective,omitempty"`
	Budget          float64            `json:"budget,omitempty"`
	Deadline        float64            `json:"deadline,omitempty"`
	Methods         []string           `json:"methods,omitempty"`
	Prices          map[string]float64 `json:"prices,omitempty"`
}

// planAnswer is the part of the answer document Plan reads.
type planAnswer struct {
	Calibrated bool   `json:"calibrated"`
	Warning    string `json:"warning"`
	Result     struct {
		Chosen  *prediction `json:"chosen"`
		Reason  string      `json:"reason"`
		Options []struct {
			Method          string      `json:"method"`
			Best            *prediction `json:"best"`
			MeetsConstraint bool        `json:"meetsConstraint"`
			Reason          string      `json:"reason"`
		} `json:"options"`
	} `json:"result"`
}

type prediction struct {
	Config struct {
		Method       string  `json:"method"`
		Parallelism  int     `json:"parallelism"`
		WorkerMemory float64 `json:"workerMemory"`
	} `json:"config"`
	Rounds     int     `json:"rounds"`
	RoundBytes float64 `json:"roundBytes"`
	Seconds    float64 `json:"seconds"`
	Cost       float64 `json:"cost"`
}

func (p *prediction) option() PlanOption {
	return PlanOption{Method: p.Config.Method, Parallelism: p.Config.Parallelism, WorkerMemory: int64(p.Config.WorkerMemory),
		Rounds: p.Rounds, RoundBytes: int64(p.RoundBytes), Seconds: p.Seconds, Dollars: p.Cost, Feasible: true}
}

// Plan asks the session gateway's shuffle planner how to run a shuffle
// (a dry run: nothing runs) with the cluster's calibration. It needs the
// right to start sessions in the client's namespace (the ClusterRole
// ziptrail-session-runner); a request the planner refuses is KindInvalid
// with the reason.
func (c *Client) Plan(ctx context.Context, req PlanRequest) (*Plan, error) {
	gw, err := c.gateway("plan")
	if err != nil {
		return nil, err
	}
	body, err := json.Marshal(planRequest{DataBytes: float64(req.Size), FastCapacity: float64(req.FastCapacity), PodMemory: float64(req.PodMemory),
		MinWorkerMemory: float64(req.MinWorkerMemory), MaxWorkerMemory: float64(req.MaxWorkerMemory), MaxParallelism: req.MaxParallelism,
		Objective: req.Objective, Budget: req.Budget, Deadline: req.Deadline.Seconds(), Methods: req.Methods, Prices: req.Prices})
	if err != nil {
		return nil, &ziptrail.Error{Kind: ziptrail.KindInvalid, Op: "plan", Err: err}
	}
	resp, err := gw.PlanShuffle(ctx, &gatewayv1.PlanShuffleRequest{Namespace: c.Namespace, RequestJson: body})
	if err != nil {
		return nil, gatewayError(ctx, "plan", err)
	}
	return parsePlan(resp.GetExplanationJson())
}

func parsePlan(doc []byte) (*Plan, error) {
	var a planAnswer
	if err := json.Unmarshal(doc, &a); err != nil {
		return nil, &ziptrail.Error{Kind: ziptrail.KindInternal, Op: "plan", Err: fmt.Errorf("the gateway's plan: %w", err)}
	}
	p := &Plan{Reason: a.Result.Reason, Calibrated: a.Calibrated, Warning: a.Warning, Document: doc}
	for _, o := range a.Result.Options {
		opt := PlanOption{Method: o.Method}
		if o.Best != nil {
			opt = o.Best.option()
		}
		opt.MeetsConstraint, opt.Reason = o.MeetsConstraint, o.Reason
		p.Alternatives = append(p.Alternatives, opt)
	}
	if a.Result.Chosen != nil {
		for i := range p.Alternatives {
			if p.Alternatives[i].Method == a.Result.Chosen.Config.Method {
				p.Chosen = &p.Alternatives[i]
			}
		}
	}
	return p, nil
}
