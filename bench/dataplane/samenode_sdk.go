package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi"
	"github.com/ziptrail/ziptrail/internal/dataplane/localapi/sidecarv1"
	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/samenode"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
)

// The same-node rows through the functions' local APIs, as the sidecar
// wires them (sidecar/samenode.go): the producer's local API adopts the
// sealed memfd its function puts on the object socket (the same-node
// server hands that memfd out), the consumer's local API passes the
// memfd it received on to its function, which maps it. Timed: put + get
// + touching every page.
//   - SDK, produced in place: the function wrote its object into an
//     Alloc'd buffer (a memfd) before the timer starts.
//   - SDK, Put of a []byte: the put's copy into a new memfd is timed.
const (
	snSDKInPlace = "same node SDK: Alloc'd memfd, passed on"
	snSDKPut     = "same node SDK: Put of a []byte, memfd passed on"
)

type snSDK struct {
	prod, cons *localapi.Client
	stop       []func()
}

// startSDK starts the two local APIs on the same-node fixture's store
// (the producer) and a consumer store, with their object sockets.
func (s *sameNode) startSDK() (*snSDK, error) {
	out := &snSDK{}
	keys := s.env.keys
	mk := func(api *localapi.Server) (*localapi.Client, error) {
		sockDir, err := os.MkdirTemp("", "ztsn")
		if err != nil {
			return nil, err
		}
		if api.Dir, err = os.MkdirTemp("/dev/shm", "ztsn"); err != nil {
			return nil, err
		}
		sock := filepath.Join(sockDir, "sidecar.sock")
		ln, err := localapi.Listen(sock)
		if err != nil {
			return nil, err
		}
		oln, err := localapi.ListenObjects(sock)
		if err != nil {
			return nil, err
		}
		go func() { _ = api.Serve(ln) }()
		go func() { _ = api.ServeObjects(oln) }()
		dir := api.Dir
		out.stop = append(out.stop, func() { api.Stop(); _ = os.RemoveAll(sockDir); _ = os.RemoveAll(dir) })
		return localapi.Dial(sock, api.Dir)
	}
	common := func(st *store.Store, addr string) *localapi.Server {
		return &localapi.Server{Store: st, Addr: addr, Namespace: "bench", Function: "f", InlineThreshold: 64 << 10, MaxObjectBytes: 8 << 30,
			KeySource: localapi.KeysFunc(func(context.Context) (*ref.Keyring, error) { return keys, nil })}
	}
	prod := common(s.st, s.addr)
	prod.Sealer = localapi.SealFunc(func(r ref.Record) ref.Record { r.Node, r.Pod = "bench-node", s.pod; return r })
	prod.Adopter = s.srv
	cons := common(store.New(8<<30, nil), "127.0.0.1:1")
	cons.SameNodeGet = func(ctx context.Context, r string) (*samenode.Object, bool, error) {
		o, err := s.cli.Get(ctx, r)
		if err != nil {
			return nil, !samenode.Fallback(err), err
		}
		return o, true, nil
	}
	var err error
	if out.prod, err = mk(prod); err != nil {
		return nil, err
	}
	if out.cons, err = mk(cons); err != nil {
		return nil, err
	}
	return out, nil
}

func (d *snSDK) close() {
	d.prod.Close()
	d.cons.Close()
	for _, f := range d.stop {
		f()
	}
}

// inPlace: Alloc and write before the timer; timed: put, get, touch.
func (d *snSDK) inPlace(ctx context.Context, data []byte) (func() error, error) {
	buf, err := d.prod.Alloc(ctx, len(data))
	if err != nil {
		return nil, err
	}
	copy(buf.Data, data)
	return func() error {
		resp, err := buf.Put(ctx, &sidecarv1.PutRequest{Reads: 1})
		if err != nil {
			return err
		}
		return d.get(ctx, resp.GetRef(), len(data))
	}, nil
}

func (d *snSDK) putBytes(ctx context.Context, data []byte) error {
	resp, err := d.prod.PutObject(ctx, data, &sidecarv1.PutRequest{Reads: 1})
	if err != nil {
		return err
	}
	return d.get(ctx, resp.GetRef(), len(data))
}

func (d *snSDK) get(ctx context.Context, r string, size int) error {
	_, m, err := d.cons.GetMapped(ctx, r)
	if err != nil {
		return err
	}
	defer m.Close()
	if len(m.Data) != size {
		return fmt.Errorf("got %d bytes of %d", len(m.Data), size)
	}
	for i := 0; i < len(m.Data); i += 4096 {
		sink ^= m.Data[i]
	}
	return nil
}
