package gateway

// The shuffle planner's dry run (issue 17): POST
// /v1/namespaces/{ns}/shuffle/plan and gRPC PlanShuffle plan a shuffle with
// internal/shuffle/plan and the installation's calibration, and answer with
// the document of `ziptrail explain -o json` (plan.Explanation). They are
// authorized like starting a session (verb create on workflows/sessions in
// the namespace, no workflow named): whoever may run sessions there may ask
// how to run one. Nothing of the namespace is read.
//
// The calibration is the one `ziptrail calibrate --configmap` writes: the
// ConfigMap model.ConfigMapName (key model.ConfigMapKey) in the operator's
// own namespace — one calibration per installation, since it measures the
// installation's tiers, and one a namespace's users cannot replace. The
// chart lets the operator get that one ConfigMap. Without it (or when it
// cannot be read or is invalid) the plan uses the built-in defaults and
// says so: calibrated false, and a warning saying why.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ziptrail/ziptrail/internal/operator/gateway/gatewayv1"
	"github.com/ziptrail/ziptrail/internal/shuffle/model"
	"github.com/ziptrail/ziptrail/internal/shuffle/plan"
)

// MaxPlanRequest is the largest plan request accepted, in bytes.
const MaxPlanRequest = 64 << 10

// CalibrationSource gives the planner the installation's calibration.
type CalibrationSource interface {
	// Calibration returns the calibration to plan with; when there is none
	// to use it returns the built-in defaults (model.DefaultCalibration)
	// and, when something is wrong rather than merely absent, a warning.
	Calibration(ctx context.Context) (cal model.Calibration, warning string)
}

// ConfigMapCalibration reads the calibration from a ConfigMap, keeping
// what it read for TTL.
type ConfigMapCalibration struct {
	// Reader reads the ConfigMap; use an uncached reader (a manager's
	// APIReader): a cached client would list and watch every ConfigMap of
	// the cluster, which the operator may not.
	Reader client.Reader
	// Namespace is the operator's namespace; Name defaults to
	// model.ConfigMapName.
	Namespace, Name string
	// TTL is how long a read calibration is reused (default 30s); a failed
	// read is retried after 5s.
	TTL time.Duration

	mu      sync.Mutex
	cal     model.Calibration
	warning string
	expires time.Time
}

// Calibration implements CalibrationSource.
func (c *ConfigMapCalibration) Calibration(ctx context.Context) (model.Calibration, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if now.Before(c.expires) {
		return c.cal, c.warning
	}
	name := c.Name
	if name == "" {
		name = model.ConfigMapName
	}
	c.cal, c.warning = model.DefaultCalibration(), ""
	ttl := orDefault(c.TTL, 30*time.Second)
	var cm corev1.ConfigMap
	// Not the caller's cancellation: what is read is kept for others.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	err := c.Reader.Get(rctx, client.ObjectKey{Namespace: c.Namespace, Name: name}, &cm)
	switch {
	case apierrors.IsNotFound(err):
		// Not calibrated: the defaults, as documented, no warning.
	case err != nil:
		c.warning = fmt.Sprintf("cannot read the calibration ConfigMap %s/%s (%v): using the built-in defaults", c.Namespace, name, err)
		ttl = 5 * time.Second
	default:
		cal, err := model.FromConfigMapData(cm.Data)
		if err != nil {
			c.warning = fmt.Sprintf("the calibration ConfigMap %s/%s is not a valid calibration (%v): using the built-in defaults; run `ziptrail calibrate --configmap %s/%s` again", c.Namespace, name, err, c.Namespace, name)
		} else {
			c.cal = cal
		}
	}
	c.expires = now.Add(ttl)
	return c.cal, c.warning
}

// PlanAnswer is the plan route's answer: the explain document, and a
// warning when the calibration could not be used.
type PlanAnswer struct {
	plan.Explanation
	Warning string `json:"warning,omitempty"`
}

// planShuffle plans the JSON request body; code is the HTTP status of err.
func (h *Handler) planShuffle(ctx context.Context, body []byte) (ans PlanAnswer, code int, err error) {
	in, prices, err := plan.DecodeRequest(body)
	if err != nil {
		return ans, http.StatusBadRequest, err
	}
	cal := model.DefaultCalibration()
	if h.Calibration != nil {
		cal, ans.Warning = h.Calibration.Calibration(ctx)
	}
	if ans.Explanation, err = plan.Explain(cal, prices, in); err != nil {
		// Explain fails for inputs only (Plan's checks), or for a
		// calibration model.New refuses.
		var code = http.StatusBadRequest
		if _, merr := model.New(cal.Params, prices); merr != nil {
			code = http.StatusInternalServerError
		}
		return ans, code, err
	}
	return ans, http.StatusOK, nil
}

func (h *Handler) plan(w http.ResponseWriter, r *http.Request) {
	ns := r.PathValue("ns")
	if err := checkNames(ns, ""); err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	if !h.allowHTTP(w, r, Attributes{Verb: "create", Namespace: ns}) {
		return
	}
	if r.ContentLength > MaxPlanRequest {
		writeError(w, http.StatusRequestEntityTooLarge, "a plan request of %d bytes exceeds the limit of %d bytes", r.ContentLength, MaxPlanRequest)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxPlanRequest))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, "a plan request exceeds the limit of %d bytes", MaxPlanRequest)
			return
		}
		writeError(w, http.StatusBadRequest, "read the plan request: %v", err)
		return
	}
	ans, code, err := h.planShuffle(r.Context(), body)
	if err != nil {
		writeError(w, code, "%v", err)
		return
	}
	writeJSON(w, http.StatusOK, ans)
}

// PlanShuffle implements gatewayv1.GatewayServer.
func (g *GRPC) PlanShuffle(ctx context.Context, req *gatewayv1.PlanShuffleRequest) (*gatewayv1.PlanShuffleResponse, error) {
	if err := checkNames(req.Namespace, ""); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := g.H.allow(ctx, token(ctx), Attributes{Verb: "create", Namespace: req.Namespace}); err != nil {
		return nil, status.Error(grpcCode(authError(err).Code), err.Error())
	}
	if len(req.RequestJson) > MaxPlanRequest {
		return nil, status.Errorf(codes.ResourceExhausted, "a plan request of %d bytes exceeds the limit of %d bytes", len(req.RequestJson), MaxPlanRequest)
	}
	ans, code, err := g.H.planShuffle(ctx, req.RequestJson)
	if err != nil {
		return nil, status.Error(grpcCode(code), err.Error())
	}
	data, err := json.Marshal(ans)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "encode the plan: %v", err)
	}
	return &gatewayv1.PlanShuffleResponse{ExplanationJson: data}, nil
}
