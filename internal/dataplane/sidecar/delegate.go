package sidecar

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ziptrail/ziptrail/internal/engine"
	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/invocation/call"
	"github.com/ziptrail/ziptrail/internal/invocation/podpick"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// Delegated firing (docs/control-stream.md): the operator sends this
// sidecar, over its authenticated control stream, its workflow's Immediate
// and ByName triggers with their targets' routes. When the function sends
// an object into such a trigger's bucket, the sidecar invokes the target
// itself — the dispatcher's request (package call), under the id the
// engine derives for that firing (engine.DelegatedInvocation) — and says
// so on the object (invocation.Object.FiredLocally), so the engine records
// the firing instead of sending it. The target's sidecar reports that
// invocation's outcome over its own control stream (reportOutcome).

// headerReported, on the response to a delegated invocation, says the
// sidecar that ran it reported its outcome to the operator itself.
const headerReported = "Ziptrail-Outcome-Reported"

// delegateWriteTimeout bounds the wait for a delegated request to be
// written: past it the invocation is cancelled and left to the engine.
const delegateWriteTimeout = 2 * time.Second

// maxDelegatedReturn bounds the return value a delegated invocation's
// sidecar reports over the control stream.
const maxDelegatedReturn = 1 << 20

type delegator struct {
	byBucket atomic.Pointer[map[string][]*controlv1.DelegatedTrigger]
	clients  sync.Map // ingress ("" for none) -> *http.Client, kept-alive connections
	// receivers are the targets whose sidecars answered with their
	// idempotency key: a lost answer of theirs is sent again (call.Send).
	receivers call.Receivers
	// inflight counts the requests sent straight to each target pod.
	inflight podpick.Inflight
}

// pushedPods is a call.Router over the ready pods the operator sent with a
// delegated trigger (direct routing, docs/dispatch.md): a delegated
// invocation goes straight to one of them, by its URL when there is none
// or the one picked refuses it.
type pushedPods struct {
	t        *controlv1.DelegatedTrigger
	inflight *podpick.Inflight
}

func (p pushedPods) Pick(_ *invocation.Envelope, node string) (string, func(call.Verdict)) {
	if len(p.t.Pods) == 0 {
		return "", nil
	}
	pods := make([]podpick.Pod, 0, len(p.t.Pods))
	for _, pod := range p.t.Pods {
		if pod.GetAddr() != "" {
			pods = append(pods, podpick.Pod{Addr: pod.GetAddr(), Node: pod.GetNode()})
		}
	}
	addr, done := p.inflight.Pick(pods, node)
	if addr == "" {
		return "", nil
	}
	return addr, func(call.Verdict) { done() }
}

// setDelegations replaces the triggers this sidecar fires (nil: none).
func (s *Sidecar) setDelegations(d *controlv1.Delegations) {
	m := map[string][]*controlv1.DelegatedTrigger{}
	for _, t := range d.GetTriggers() {
		if t.Bucket != "" && t.Function != "" && t.Service != "" && t.Url != "" {
			m[t.Bucket] = append(m[t.Bucket], t)
		}
	}
	s.deleg.byBucket.Store(&m)
}

// client is the kept-alive HTTP client for one ingress (or direct).
func (d *delegator) client(ingress string) *http.Client {
	if c, ok := d.clients.Load(ingress); ok {
		return c.(*http.Client)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	if ingress != "" {
		dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
		tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, network, ingress)
		}
	}
	c, _ := d.clients.LoadOrStore(ingress, &http.Client{Transport: tr, Timeout: 15 * time.Minute})
	return c.(*http.Client)
}

// directClient is the kept-alive HTTP client for requests straight to
// target pods (direct routing): dials bounded by call.DirectDialTimeout.
func (d *delegator) directClient() *http.Client {
	const key = "\x00direct" // not an ingress address
	if c, ok := d.clients.Load(key); ok {
		return c.(*http.Client)
	}
	c, _ := d.clients.LoadOrStore(key, &http.Client{Transport: call.DirectTransport(nil, 64), Timeout: 15 * time.Minute})
	return c.(*http.Client)
}

// fireDelegated invokes the delegated triggers' targets for the outputs of
// env's invocation and records on each output what it made. An execution
// that is a re-execution fires nothing itself (its original may have); nor
// does an invocation of another workflow or namespace than this pod's. It
// returns whether any output changed.
func (s *Sidecar) fireDelegated(env *invocation.Envelope, outs *invocation.Outputs) bool {
	mp := s.deleg.byBucket.Load()
	if mp == nil || len(*mp) == 0 || s.ctl == nil || env.Session == "" || env.Invocation != engine.BaseInvocation(env.Invocation) ||
		env.Namespace != s.cfg.Namespace || env.Workflow != s.cfg.Workflow {
		return false
	}
	type pending struct {
		obj   int
		id    string
		wrote chan bool
	}
	var fired []pending
	for i := range outs.Objects {
		o := &outs.Objects[i]
		for _, t := range (*mp)[o.Bucket] {
			prim := engine.Immediate
			if t.Key != "" {
				prim = engine.ByName
			}
			if !engine.Matches(engine.TriggerSpec{Primitive: prim, Key: t.Key}, o.Key) {
				continue
			}
			id := engine.DelegatedInvocation(env.Session, t.Trigger, t.Function, o.Bucket, o.Key)
			denv := &invocation.Envelope{Namespace: env.Namespace, Workflow: env.Workflow, Function: t.Service, Session: env.Session,
				Invocation: id, Trigger: t.Trigger, Delegated: true,
				Objects: []invocation.Object{{Bucket: o.Bucket, Key: o.Key, Size: o.Size, Ref: o.Ref, Inline: o.Inline, Metadata: o.Metadata}}}
			p := pending{obj: i, id: id, wrote: make(chan bool, 1)}
			fired = append(fired, p)
			go s.sendDelegated(denv, t, p.wrote)
		}
	}
	changed := false
	for _, p := range fired {
		if <-p.wrote {
			o := &outs.Objects[p.obj]
			o.FiredLocally = append(o.FiredLocally, p.id)
			changed = true
		}
	}
	return changed
}

// sendDelegated sends one delegated invocation; wrote learns whether its
// request went out in time (else it is cancelled, and the engine fires
// it). A failure the target's sidecar did not report itself (no response
// from it: a route not ready, a pod gone) is reported here, so the engine
// re-executes the invocation or fails its session by its rules.
func (s *Sidecar) sendDelegated(env *invocation.Envelope, t *controlv1.DelegatedTrigger, wrote chan<- bool) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sent := make(chan bool, 1)
	opts := call.Options{Client: s.deleg.client(t.Ingress), Wrote: func(ok bool) { sent <- ok }, Receivers: &s.deleg.receivers,
		URL:          func(context.Context, *invocation.Envelope) (string, error) { return t.Url, nil },
		Router:       pushedPods{t: t, inflight: &s.deleg.inflight},
		DirectClient: s.deleg.directClient(),
		OnRoute:      func(route string) { delegatedRequests.WithLabelValues(route).Inc() }}
	if node := s.cfg.SameNode.Node; node != "" {
		opts.ProducerNode = func(*invocation.Envelope) string { return node }
	}
	opts.Defaults()
	done := make(chan call.Result, 1)
	go func() { done <- call.Send(ctx, &opts, env) }()
	timer := time.NewTimer(delegateWriteTimeout)
	var ok bool
	select {
	case ok = <-sent:
	case <-timer.C:
	}
	timer.Stop()
	wrote <- ok
	if !ok {
		delegatedRequests.WithLabelValues("not_sent").Inc()
		cancel()
		res := <-done
		if s.cfg.Log != nil {
			s.cfg.Log(fmt.Errorf("delegated invocation %s of %s not sent, left to the engine: %v", env.Invocation, t.Function, res.Err))
		}
		return
	}
	res := <-done
	if res.Err == nil || res.Header.Get(headerReported) != "" {
		return
	}
	_ = s.ctl.Send(&controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_FunctionFinished{FunctionFinished: &controlv1.FunctionFinished{
		Session: env.Session, Function: t.Function, InvocationId: env.Invocation, Failed: true,
		Error: fmt.Sprintf("delegated invocation of %s: %v", t.Function, res.Err)}}})
}

// startHold is how long a delegated invocation's start report waits to
// go out with its outcome, in one control message (a step's one report),
// unless Config.StartReportHold says otherwise; a function that runs
// longer has its start reported on its own.
const startHold = 50 * time.Millisecond

// startReport is a delegated invocation's start, held for its outcome.
type startReport struct {
	mu    sync.Mutex
	msg   *controlv1.SidecarMessage
	timer *time.Timer
}

// holdStarted returns the report that an invocation a producer's sidecar
// sent (env.Delegated, as received: before its inputs were resolved)
// starts here, with the arguments a re-execution needs: the engine
// records the firing from it when it comes before the producer's claim,
// and this pod owns the invocation's events from then on. It goes out
// with the invocation's outcome (reportOutcome), after startHold, or when
// the invocation ends without one (flush), whichever comes first; nil: no
// report.
func (s *Sidecar) holdStarted(env *invocation.Envelope) *startReport {
	if !env.Delegated || s.ctl == nil {
		return nil
	}
	args, err := invocation.RerunArgs(env)
	if err != nil {
		return nil
	}
	r := &startReport{msg: &controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_FunctionStarted{FunctionStarted: &controlv1.FunctionStarted{
		Session: env.Session, Function: strings.TrimPrefix(env.Function, env.Workflow+"-"), InvocationId: env.Invocation, Args: args}}}}
	r.mu.Lock()
	hold := s.cfg.StartReportHold
	if hold <= 0 {
		hold = startHold
	}
	r.timer = time.AfterFunc(hold, func() { r.flush(s) })
	r.mu.Unlock()
	return r
}

// take returns the start report if it has not gone out yet (nil r: nil).
func (r *startReport) take() *controlv1.SidecarMessage {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.msg
	r.msg = nil
	if r.timer != nil {
		r.timer.Stop()
	}
	return m
}

// flush sends the start report on its own if it has not gone out yet.
func (r *startReport) flush(s *Sidecar) {
	if m := r.take(); m != nil {
		_ = s.ctl.Send(m)
	}
}

// reportOutcome reports the outcome of an invocation over this sidecar's
// control stream, as the operator's dispatcher would from the response:
// its objects, then that it finished, with its return value, in one
// message with its start when that was held (st). code is the function's
// status; outs its outputs (nil: ret is its whole response).
// For an invocation a producer's sidecar sent (env.Delegated) it is the
// only report; for one the engine dispatched it is a second one, so that
// an operator whose HTTP client lost the response learns the outcome
// (the engine applies whichever comes first): one whose return value is
// too large to report here is left to the response.
func (s *Sidecar) reportOutcome(env *invocation.Envelope, st *startReport, code int, outs *invocation.Outputs, ret []byte, sentLocally int, failure string) {
	msgs := s.outcomeMessages(env, code, outs, ret, sentLocally, failure)
	if m := st.take(); m != nil {
		msgs = append([]*controlv1.SidecarMessage{m}, msgs...)
	}
	if len(msgs) > 0 {
		_ = s.ctl.SendAll(msgs...)
	}
}

// outcomeReport is the report of one answered invocation: kept, when the
// answer names a reservation (HeaderOutcomeKept), else sent (with its
// held start, for a delegated one).
type outcomeReport struct {
	kept    uint64
	started *startReport
}

// outcome reports the function's successful (or passed-through) answer.
func (r *outcomeReport) outcome(s *Sidecar, env *invocation.Envelope, code int, outs *invocation.Outputs, ret []byte, sentLocally int) {
	if r.kept == 0 {
		s.reportOutcome(env, r.started, code, outs, ret, sentLocally, "")
		return
	}
	_ = s.ctl.Keep(r.kept, s.outcomeMessages(env, code, outs, ret, sentLocally, "")...) // as Send's: ErrQueueFull after QueueWait
	r.kept = 0
}

// end drops a reservation its answer did not fill.
func (r *outcomeReport) end(s *Sidecar) {
	if r.kept != 0 {
		_ = s.ctl.Keep(r.kept)
	}
}

// outcomeMessages are reportOutcome's events.
func (s *Sidecar) outcomeMessages(env *invocation.Envelope, code int, outs *invocation.Outputs, ret []byte, sentLocally int, failure string) []*controlv1.SidecarMessage {
	if s.ctl == nil {
		return nil
	}
	if !env.Delegated && code == http.StatusOK && failure == "" && (outs != nil && len(outs.Return) > maxDelegatedReturn || outs == nil && len(ret) > maxDelegatedReturn) {
		return nil
	}
	var msgs []*controlv1.SidecarMessage
	fn := strings.TrimPrefix(env.Function, env.Workflow+"-")
	fin := &controlv1.FunctionFinished{Session: env.Session, Function: fn, InvocationId: env.Invocation}
	switch {
	case failure != "":
		fin.Failed, fin.Error = true, failure
	case code != http.StatusOK:
		fin.Failed, fin.Error = true, fmt.Sprintf("function %s/%s answered %d", env.Namespace, env.Function, code)
	case outs != nil && len(outs.Return) > maxDelegatedReturn, outs == nil && len(ret) > maxDelegatedReturn:
		fin.Failed, fin.Error = true, fmt.Sprintf("its return value exceeds %d bytes, the most a delegated invocation returns: send it as an object", maxDelegatedReturn)
	default:
		names := map[string]bool{}
		if outs != nil {
			ret = outs.Return
			for _, o := range outs.Objects {
				names[o.Bucket+"/"+o.Key] = true
				msgs = append(msgs, &controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_ObjectReady{ObjectReady: &controlv1.ObjectReady{
					Session: env.Session, Bucket: o.Bucket, Key: o.Key, Size: o.Len(), Ref: o.Ref, Inline: inlineOf(o), Metadata: o.Metadata,
					ProducerFunction: fn, InvocationId: env.Invocation, FiredLocally: o.FiredLocally}}})
			}
		}
		fin.OutputsSent = uint32(len(names) + sentLocally)
		if ret == nil {
			ret = []byte{}
		}
		fin.ReturnValue = ret
	}
	return append(msgs, &controlv1.SidecarMessage{Msg: &controlv1.SidecarMessage_FunctionFinished{FunctionFinished: fin}})
}

// inlineOf is an object's inline bytes for ObjectReady: set (possibly
// empty) when it has no reference.
func inlineOf(o invocation.Object) []byte {
	if o.Ref != "" {
		return nil
	}
	if o.Inline == nil {
		return []byte{}
	}
	return o.Inline
}
