package directmsg

import "github.com/prometheus/client_golang/prometheus"

// opens counts the node messaging socket's requests by result: direct,
// nodirect, refused_auth, refused_malformed, refused_fds, bad_peer, busy.
var opens = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "ziptrail_messages_direct_opens_total",
	Help: "Requests for a same-node direct channel on this pod's node messaging socket, by result.",
}, []string{"result"})

func init() { prometheus.MustRegister(opens) }
