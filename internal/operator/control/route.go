package control

import (
	"context"
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// ErrMoved is what an Events implementation wraps when the sidecar's
// workflow is no longer served here (its engine bucket moved to another
// operator replica, docs/sharding.md). The event is not acknowledged and
// the stream ends with UNAVAILABLE: the sidecar reconnects and sends it
// again, to the bucket's owner.
var ErrMoved = errors.New("this operator replica no longer owns the workflow's engine bucket")

// Router decides where an authenticated sidecar's stream belongs: nil to
// serve it here, a Redirect to send it to the bucket's owner. It is asked
// only after the token and the Hello have been verified, so a caller
// learns nothing about which replica owns what before it has proved who it
// is. An error (no owner at the moment) ends the stream with UNAVAILABLE.
type Router func(ctx context.Context, id Identity) (*controlv1.Redirect, error)

var redirects = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "ziptrail_control_redirects_total",
	Help: "Control streams sent to another operator replica, by why: connect (the replica does not own the workflow's bucket), moved (the bucket moved away while the stream was open).",
}, []string{"why"})

func init() {
	metrics.Registry.MustRegister(redirects)
	redirects.WithLabelValues("connect")
	redirects.WithLabelValues("moved")
}

// route applies s.Route to a new stream: it reports whether the stream
// was redirected (and so has ended).
func (s *Server) route(ctx context.Context, stream controlv1.Control_ConnectServer, id Identity) (bool, error) {
	if s.Route == nil {
		return false, nil
	}
	rd, err := s.Route(ctx, id)
	if err != nil {
		return true, status.Errorf(codes.Unavailable, "the operator cannot route workflow %s/%s's stream now: %v", id.Namespace, id.Workflow, err)
	}
	if rd == nil {
		return false, nil
	}
	redirects.WithLabelValues("connect").Inc()
	return true, stream.Send(&controlv1.OperatorMessage{Msg: &controlv1.OperatorMessage_Redirect{Redirect: rd}})
}

// Moved ends the open streams whose identity match selects (the workflows
// of a bucket this replica gave up), telling each sidecar where to
// reconnect (rd; an empty address: to the control Service).
func (s *Server) Moved(match func(Identity) bool, rd *controlv1.Redirect) int {
	s.mu.RLock()
	var targets []*conn
	for c := range s.conns {
		if match(c.id) {
			targets = append(targets, c)
		}
	}
	s.mu.RUnlock()
	for _, c := range targets {
		c.moveOnce.Do(func() {
			c.redirect = rd
			close(c.moved)
		})
		redirects.WithLabelValues("moved").Inc()
	}
	return len(targets)
}

// movedErr is how a stream ends after its Redirect was sent.
func movedErr(c *conn) error {
	return status.Errorf(codes.Unavailable, "workflow %s/%s's engine bucket moved to another operator replica: reconnect", c.id.Namespace, c.id.Workflow)
}
