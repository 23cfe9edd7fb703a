package messaging

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime/debug"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Limits of the message streams a sidecar serves on its data-plane port,
// which takes connections from any pod (issue 31).
const (
	defaultMaxStreams       = 1024
	defaultHandshakeTimeout = 5 * time.Second
	// A sidecar opens one stream to each other sidecar it sends to
	// (another only to replace a broken one): a source address with more
	// is holding places of the cap that other pods' streams need.
	defaultMaxStreamsPerPeer = 64
)

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil && d > 0 {
		return d
	}
	return def
}

func (r *Router) handshakeTimeout() time.Duration { return r.cfg.HandshakeTimeout }

// openStream counts a new stream from another sidecar: false (the stream
// refused, counted and logged) when MaxStreams are served already.
func (r *Router) openStream(c net.Conn) bool {
	peer := peerHost(c)
	r.peersMu.Lock()
	if r.peers[peer] >= r.cfg.MaxStreamsPerPeer {
		r.peersMu.Unlock()
		streamsRefused.WithLabelValues("peer_limit").Inc()
		logLimited("peer_limit", "message stream from %s refused: %d streams from that address served already (ZIPTRAIL_MSG_STREAMS_PER_PEER)", c.RemoteAddr(), r.cfg.MaxStreamsPerPeer)
		return false
	}
	if r.peers == nil {
		r.peers = map[string]int{}
	}
	r.peers[peer]++
	r.peersMu.Unlock()
	if n := r.serving.Add(1); n > int64(r.cfg.MaxStreams) {
		r.serving.Add(-1)
		r.dropPeer(peer)
		streamsRefused.WithLabelValues("limit").Inc()
		logLimited("limit", "message stream from %s refused: %d streams served already (ZIPTRAIL_MSG_STREAMS_MAX)", c.RemoteAddr(), r.cfg.MaxStreams)
		return false
	}
	streamsOpen.Inc()
	return true
}

func (r *Router) closeStream(c net.Conn) {
	r.serving.Add(-1)
	r.dropPeer(peerHost(c))
	streamsOpen.Dec()
}

func (r *Router) dropPeer(peer string) {
	r.peersMu.Lock()
	defer r.peersMu.Unlock()
	if r.peers[peer]--; r.peers[peer] <= 0 {
		delete(r.peers, peer)
	}
}

// peerHost is the address a stream comes from, without its port.
func peerHost(c net.Conn) string {
	a := c.RemoteAddr()
	if a == nil {
		return ""
	}
	if h, _, err := net.SplitHostPort(a.String()); err == nil {
		return h
	}
	return a.String()
}

// hungUp: the peer of c closed its end (or c was closed here). A stream
// reader that waits for room in an inbox reads nothing, so it looks with
// poll (POLLRDHUP).
func hungUp(c net.Conn) error {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	hup := false
	if err := rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		if n, _ := unix.Poll(fds, 0); n > 0 && fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0 {
			hup = true
		}
	}); err != nil {
		return err
	}
	if hup {
		return errHungUp
	}
	return nil
}

var errHungUp = errors.New("the peer hung up while its messages waited for room")

// recovered handles a panic of a goroutine that reads a peer's bytes
// (what: where; the caller then closes that connection): counted and
// logged with its stack, and the sidecar goes on.
func recovered(where, what string, v any) {
	panics.WithLabelValues(where).Inc()
	logf("%s: dropped after a panic: %v\n%s", what, v, debug.Stack())
}

// logf writes a line to the sidecar's log (standard error).
func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "queue-proxy-zl: messaging: "+format+"\n", args...)
}

// logLimited is logf at most once a second per kind: a peer that makes
// the sidecar refuse its connections in a loop does not flood the log.
// The lines held back are counted in the next one.
func logLimited(kind, format string, args ...any) {
	limited.mu.Lock()
	if limited.last == nil {
		limited.last, limited.held = map[string]time.Time{}, map[string]int{}
	}
	now := time.Now()
	if now.Sub(limited.last[kind]) < time.Second {
		limited.held[kind]++
		limited.mu.Unlock()
		return
	}
	held := limited.held[kind]
	limited.last[kind], limited.held[kind] = now, 0
	limited.mu.Unlock()
	if held > 0 {
		format += fmt.Sprintf(" (and %d more like it not logged)", held)
	}
	logf(format, args...)
}

var limited struct {
	mu   sync.Mutex
	last map[string]time.Time
	held map[string]int
}
