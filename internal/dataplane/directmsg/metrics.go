package directmsg

import (
	"fmt"
	"os"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// opens counts the node messaging socket's requests by result: direct,
// nodirect, refused_auth, refused_malformed, refused_fds, bad_peer, busy,
// panic.
var opens = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "ziptrail_messages_direct_opens_total",
	Help: "Requests for a same-node direct channel on this pod's node messaging socket, by result.",
}, []string{"result"})

// channelPanics counts the panics Conn's Send and Recv recovered from
// (the channel is closed, its Recv and Send fail with ErrFrame).
var channelPanics = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "ziptrail_messages_direct_channel_panics_total",
	Help: "Panics recovered while reading a direct channel's frames (the channel was dropped).",
})

func init() { prometheus.MustRegister(opens, channelPanics) }

// recovered, deferred by a goroutine that reads a peer's bytes, stops a
// panic there: counted in c (result "panic") and logged with its stack;
// the deferred closes of the goroutine's connection run next.
func recovered(c *prometheus.CounterVec, what string) {
	if v := recover(); v != nil {
		c.WithLabelValues("panic").Inc()
		fmt.Fprintf(os.Stderr, "queue-proxy-zl: directmsg: %s: dropped after a panic: %v\n%s", what, v, debug.Stack())
	}
}

// recoverFrame, deferred by Conn's Send and Recv, turns a panic (a peer's
// bytes the code did not expect) into an ErrFrame error in *err and
// closes the channel's socket.
func (c *Conn) recoverFrame(err *error) {
	if v := recover(); v != nil {
		channelPanics.Inc()
		_ = c.c.Close()
		*err = fmt.Errorf("%w: a panic reading the channel: %v", ErrFrame, v)
	}
}
