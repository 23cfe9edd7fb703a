package sidecar

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi"
	"github.com/ziptrail/ziptrail/internal/dataplane/pull"
	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/samenode"
)

// SameNodeConfig enables the same-node data plane (package samenode): the
// node directory shared by the node's queue-proxies, this pod's node name
// and UID. ziptrail's pod webhook sets all three on queue-proxy
// ($ZIPTRAIL_NODE_DIR, $ZIPTRAIL_NODE_NAME, $ZIPTRAIL_POD_UID; Knative
// gives queue-proxy neither); any empty disables the path (TCP only).
type SameNodeConfig struct {
	Dir, Node, PodUID string
}

func (c SameNodeConfig) enabled() bool { return c.Dir != "" && c.Node != "" && c.PodUID != "" }

// sameNodeFromEnv reads the variables the webhook sets.
func sameNodeFromEnv() SameNodeConfig {
	return SameNodeConfig{Dir: os.Getenv(samenode.EnvDir), Node: os.Getenv(samenode.EnvNode), PodUID: os.Getenv(samenode.EnvPodUID)}
}

// startSameNode listens on this pod's socket in the node directory. A
// failure (no directory, not writable) is logged and leaves the sidecar
// on the TCP data plane: references then carry no node, so consumers do
// not try the socket.
func (s *Sidecar) startSameNode() {
	c := s.cfg.SameNode
	if !c.enabled() {
		return
	}
	srv := &samenode.Server{Store: s.Store, Keys: s.keys.Load, Addr: s.addr(), Pod: c.PodUID,
		Log: func(err error) { s.logf("same-node: %v", err) }}
	ln, err := srv.Listen(c.Dir)
	if err != nil {
		s.logf("same-node data plane off (TCP only): %v", err)
		return
	}
	s.sameNode = srv
	go func() { _ = srv.Serve(ln) }()
}

func (s *Sidecar) logf(format string, args ...any) {
	if s.cfg.Log != nil {
		s.cfg.Log(fmt.Errorf(format, args...))
	}
}

// stopSameNode closes the socket (consumers then pull over TCP).
func (s *Sidecar) stopSameNode() {
	if s.sameNode != nil {
		_ = s.sameNode.Close()
	}
}

// sweepSameNode lets go of the memfds of objects the store freed.
func (s *Sidecar) sweepSameNode() {
	if s.sameNode != nil {
		s.sameNode.Sweep()
	}
}

// withNode adds this producer's node and pod UID to a record it seals,
// when it serves the same-node path (so only then: an older consumer
// sidecar cannot open a reference with these fields).
func (s *Sidecar) withNode(r ref.Record) ref.Record {
	if s.sameNode != nil {
		r.Node, r.Pod = s.cfg.SameNode.Node, s.cfg.SameNode.PodUID
	}
	return r
}

// pullTo gets a referenced object into dst: as a memfd from a producer on
// this node when the reference says it is here, else (or when that fails
// for any reason but the caller's context) over TCP. The memfd path
// copies once, into dst (the function's input file).
func (s *Sidecar) pullTo(ctx context.Context, r string, dst func(size int64) (io.WriterAt, error)) (pull.Info, error) {
	if info, err, ok := s.getSameNode(ctx, r, dst); ok {
		return info, err
	}
	return s.client.PullTo(ctx, r, dst)
}

// getSameNode tries the same-node path; ok is false when the TCP pull
// should run instead.
func (s *Sidecar) getSameNode(ctx context.Context, r string, dst func(size int64) (io.WriterAt, error)) (pull.Info, error, bool) {
	o, err, ok := s.sameNodeObject(ctx, r)
	if !ok || err != nil {
		return pull.Info{}, err, ok
	}
	defer o.Close()
	info := pull.Info{Bucket: o.Bucket, Key: o.Key, Size: o.Size}
	w, err := dst(o.Size)
	if err != nil {
		return info, err, true
	}
	return info, o.CopyTo(w), true
}

// serveObjects opens the local API's object socket (objects as
// descriptors, localapi/objsock.go) and wires it to the same-node path:
// a function's sealed memfd becomes the memfd same-node consumers get
// (Adopt, no copy), and a get of an object a producer on this node holds
// passes its memfd on to the function (no copy into an input file). A
// failure to listen leaves the function on files (the gRPC socket).
func (s *Sidecar) serveObjects(api *localapi.Server) {
	if s.cfg.SameNode.enabled() {
		api.SameNodeGet = s.sameNodeMemfd
	}
	if s.sameNode != nil {
		api.Adopter = s.sameNode
	}
	ln, err := localapi.ListenObjects(s.cfg.APISocket)
	if err != nil {
		s.logf("object socket off (files only): %v", err)
		return
	}
	go func() { _ = api.ServeObjects(ln) }()
}

// sameNodeMemfd gets a referenced object's memfd from a producer on this
// node; ok is false when the TCP pull (the gRPC Get) should run instead.
func (s *Sidecar) sameNodeMemfd(ctx context.Context, r string) (*samenode.Object, bool, error) {
	if err := s.waitKeys(ctx); err != nil {
		return nil, true, err
	}
	o, err, ok := s.sameNodeObject(ctx, r)
	return o, ok, err
}

// sameNodeObject asks the reference's producer on this node; ok false:
// not applicable, or failed in a way the TCP pull may not.
func (s *Sidecar) sameNodeObject(ctx context.Context, r string) (*samenode.Object, error, bool) {
	c := s.cfg.SameNode
	kr := s.keys.Load()
	if !c.enabled() || kr == nil {
		return nil, nil, false
	}
	cli := &samenode.Client{Dir: c.Dir, Node: c.Node, Keys: kr}
	o, err := cli.Get(ctx, r)
	if err != nil {
		if !errors.Is(err, samenode.ErrNotApplicable) && samenode.Fallback(err) {
			s.logf("same-node get failed, pulling over TCP: %v", err)
		}
		if !samenode.Fallback(err) {
			return nil, err, true
		}
		return nil, nil, false
	}
	return o, nil, true
}
