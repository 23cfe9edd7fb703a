package model

// What Predict returns: the prediction, its phases and terms, its costs.

// Term is one limit on a phase's time: the seconds the phase would take if
// that limit alone bound it.
type Term struct {
	Name    string  `json:"name"`
	Seconds float64 `json:"seconds"`
}

// Total is the phase's predicted time over its Count runs: the first
// cold, the others warm (Startup once).
func (ph Phase) Total() float64 {
	if ph.Count <= 0 {
		return 0
	}
	return float64(ph.Count)*ph.Seconds - float64(ph.Count-1)*ph.Startup
}

// Phase is one stage of the shuffle, with what bounds it.
type Phase struct {
	Name string `json:"name"`
	// Count is how many times the phase runs (the rounds, for the hybrid's
	// per-round phases).
	Count int `json:"count"`
	// Tasks is the number of tasks of one run of the phase.
	Tasks int `json:"tasks"`
	// Seconds is the first run's predicted time: Startup + the largest
	// term. Later runs of the phase (the hybrid's rounds) start warm and
	// take Seconds − Startup: see Total.
	Seconds float64 `json:"seconds"`
	// Startup is WorkerStartup, paid by the phase's first run only: its
	// function's pods are up for the next round, seconds later (Knative
	// keeps an idle pod for its scale-down window, 60 s and more).
	Startup float64 `json:"startup"`
	// BoundBy is the name of the largest term.
	BoundBy string `json:"boundBy"`
	Terms   []Term `json:"terms"`
	// StragglerSeconds is how much of the worker-bandwidth term stragglers
	// add (after speculation), whether or not that term is the largest.
	StragglerSeconds float64 `json:"stragglerSeconds"`
	// ComputeSeconds is the compute term when it adds to the transfers
	// (Params.Cores set: workers and stores share the cores); 0 otherwise.
	ComputeSeconds float64 `json:"computeSeconds,omitempty"`
	// PlatformCPU is the CPU seconds (of one core) the installation's own
	// processes spend moving the phase's bytes (Params.SlowCPU, FastCPU,
	// PodCPU); counted, with Params.Cores set, in the compute term.
	PlatformCPU float64 `json:"platformCPU,omitempty"`
	// ControlCPU is the part of PlatformCPU on the control path
	// (Params.ControlCPU: objects announced, tasks invoked).
	ControlCPU float64 `json:"controlCPU,omitempty"`
	// Workers is the number of workers billed while the phase runs.
	Workers int `json:"workers"`
	// Requests of one run of the phase: to the slow store (both buckets),
	// to the fast store.
	SlowGets float64 `json:"slowGets"`
	SlowPuts float64 `json:"slowPuts"`
	FastOps  float64 `json:"fastOps"`
}

// Costs is a prediction's cost in dollars, by resource.
type Costs struct {
	Workers      float64 `json:"workers"`
	SlowRequests float64 `json:"slowRequests"`
	SlowStorage  float64 `json:"slowStorage"`
	Fast         float64 `json:"fast"`
}

// Total is the sum.
func (c Costs) Total() float64 { return c.Workers + c.SlowRequests + c.SlowStorage + c.Fast }

// Prediction is the model's prediction for one Config.
type Prediction struct {
	Config Config `json:"config"`
	// Tasks is the number of map tasks (and of reduce tasks, or of final
	// ranges for the hybrid): P·⌈D/(P·c)⌉ with c = TaskMemoryFraction·w.
	Tasks int `json:"tasks"`
	// Rounds and RoundBytes are the hybrid's k = ⌈D/r⌉ rounds of D/k bytes.
	Rounds     int     `json:"rounds,omitempty"`
	RoundBytes float64 `json:"roundBytes,omitempty"`
	Seconds    float64 `json:"seconds"`
	Cost       float64 `json:"cost"`
	Costs      Costs   `json:"costs"`
	Phases     []Phase `json:"phases"`
	// Requests made: to the slow store (both buckets), to the fast store.
	SlowGets float64 `json:"slowGets"`
	SlowPuts float64 `json:"slowPuts"`
	FastOps  float64 `json:"fastOps"`
}

// InfeasibleError says why a Config cannot run at all (as opposed to
// running slowly or expensively).
type InfeasibleError struct {
	Method Method
	Reason string
}

func (e *InfeasibleError) Error() string { return string(e.Method) + ": " + e.Reason }

// ComputeTerm is the name of a phase's compute term (Config.Compute).
const ComputeTerm = "compute"

// Term returns the named term's seconds, or -1 if the phase has none.
func (ph Phase) Term(name string) float64 {
	for _, t := range ph.Terms {
		if t.Name == name {
			return t.Seconds
		}
	}
	return -1
}
