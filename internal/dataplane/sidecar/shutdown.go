package sidecar

import (
	"context"
	"fmt"
	"os"
)

// How a pod's sidecar ends. Knative's queue-proxy, on SIGTERM, keeps
// serving: it fails its readiness so that the pod leaves the endpoints,
// proxies what still arrives until no request came for a quiet period, waits
// for the requests in flight, and only then returns from sharedmain.Main.
// The functions of those requests still need their sidecar: its local API
// (their puts and gets), its data plane (consumers pulling their outputs)
// and its control stream (the objects they report). So the two moments are
// apart:
//
//   - Terminating, at SIGTERM: the pod's log says so (with the group
//     members still running here), and unread objects are backed up to the
//     slow tier at once, in case the pod is killed before the end.
//   - the end of the sidecar's context, after queue-proxy's drain
//     (cmd/queue-proxy-zl cancels it when sharedmain.Main returns): the
//     objects made during the drain are backed up too, members still
//     running are waited for, then the servers close.
//
// Where nothing separates the two (--standalone, tests), the end of the
// context is both.

// Terminating marks SIGTERM: the pod drains. It logs, backs unread objects
// up and returns; the sidecar keeps serving. Later calls do nothing.
func (s *Sidecar) Terminating() {
	s.terminating.Do(func() {
		if n := s.msgs.Live(); n > 0 {
			fmt.Fprintf(os.Stderr, "queue-proxy-zl: terminating with %d group member(s) running here: the data plane and the local API stay up until they leave (at most %s)\n", n, s.groupDrain())
		} else {
			fmt.Fprintf(os.Stderr, "queue-proxy-zl: terminating: serving until Knative's drain ends\n")
		}
		s.backup()
	})
}

// Stopped is closed once the sidecar's servers are closed.
func (s *Sidecar) Stopped() <-chan struct{} { return s.stopped }

// shutdown runs when the sidecar's context ends: Terminating (if SIGTERM
// did not already), the final backup, the wait for group members, then
// closeServers.
func (s *Sidecar) shutdown(closeServers func()) {
	s.Terminating()
	s.backup()
	close(s.backedUp)
	// Group members still running keep the data plane and the local API
	// until they end (Knative's drain waits for their invocations; the
	// pod's grace period bounds both).
	s.drainGroups()
	closeServers()
	close(s.stopped)
}

// backup is Backup bounded by BackupTimeout.
func (s *Sidecar) backup() {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.BackupTimeout)
	defer cancel()
	if n, err := s.Backup(ctx); err != nil && s.cfg.Log != nil {
		s.cfg.Log(fmt.Errorf("backup of unread objects (%d copied): %w", n, err))
	}
}
