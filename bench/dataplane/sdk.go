package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi"
	"github.com/ziptrail/ziptrail/internal/dataplane/localapi/sidecarv1"
	"github.com/ziptrail/ziptrail/internal/dataplane/pull"
	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
)

// sdkInPlace is the SDK path with the object produced in place (Alloc).
const sdkInPlace = "ziptrail SDK in place"

// sdkFloor is what the SDK path cannot go below: the bare pull, plus one
// round trip from a function to its sidecar for the put and one for the
// get (the object socket's hello: the sidecars' work left out).
const sdkFloor = "SDK floor"

// sdkPod is one pod as a function sees it: its sidecar's store, pull
// server and client, and the local API on a unix socket with a
// shared-memory directory, with the function's client dialled in.
type sdkPod struct {
	srv    *pull.Server
	pulls  *pull.Client
	api    *localapi.Server
	client *localapi.Client
	dir    string
	sock   string
}

func startSDKPod(keys *ref.Keyring) (*sdkPod, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	st := store.New(8<<30, nil)
	p := &sdkPod{srv: &pull.Server{Store: st, Keys: keys}, pulls: &pull.Client{Keys: keys}}
	go p.srv.Serve(ln)
	// A pod's object directory is an emptyDir of medium Memory: tmpfs.
	if p.dir, err = os.MkdirTemp("/dev/shm", "ztbench"); err != nil {
		return nil, err
	}
	sockDir, err := os.MkdirTemp("", "ztbench")
	if err != nil {
		return nil, err
	}
	p.sock = filepath.Join(sockDir, "s")
	p.api = &localapi.Server{Store: st, Addr: ln.Addr().String(), Dir: p.dir, Namespace: "bench", Function: "f",
		InlineThreshold: 64 << 10, MaxObjectBytes: 8 << 30,
		KeySource: localapi.KeysFunc(func(context.Context) (*ref.Keyring, error) { return keys, nil }),
		Puller:    p.pulls}
	apiLn, err := localapi.Listen(p.sock)
	if err != nil {
		return nil, err
	}
	// The object socket, as every sidecar serves it next to the API's:
	// small puts and gets go there (localapi/objbytes.go).
	objLn, err := localapi.ListenObjects(p.sock)
	if err != nil {
		return nil, err
	}
	go p.api.Serve(apiLn)
	go p.api.ServeObjects(objLn)
	if p.client, err = localapi.Dial(p.sock, p.dir); err != nil {
		return nil, err
	}
	p.client.InlineThreshold = 64 << 10
	return p, nil
}

func (p *sdkPod) close() {
	p.client.Close()
	p.api.Stop()
	p.srv.Close()
	p.pulls.Close()
	os.RemoveAll(p.dir)
	os.RemoveAll(filepath.Dir(p.sock))
}

// sdkOne is what two functions see: put through pod A's local API (the
// object goes as a shared-memory file the sidecar keeps, given back to
// the client once freed), get through pod B's (pulled from A into a
// shared-memory file the sidecar lends), mapped as the Go SDK maps it
// (reading it is then the function's own work), closed (the file goes
// back to B's sidecar for the next get). See docs/dataplane.md, "Reused
// files".
func (e *env) sdkOne(ctx context.Context, data []byte) error {
	r, err := e.sdkA.client.Put(ctx, data, 1)
	if err != nil {
		return err
	}
	return sdkGet(ctx, e.sdkB, r, data)
}

// sdkInPlace is the object produced in place: the function wrote it into
// an Alloc'd buffer (a file the sidecar gave back, mapped) before the
// timer starts, as the bare pull's object is in the producer's heap
// before its timer starts; timed: the buffer's put (no copy) and the get.
func (e *env) sdkInPlace(ctx context.Context, data []byte) (func() error, error) {
	buf, err := e.placeA.client.Alloc(ctx, len(data))
	if err != nil {
		return nil, err
	}
	copy(buf.Data, data)
	return func() error {
		resp, err := buf.Put(ctx, &sidecarv1.PutRequest{Reads: 1})
		if err != nil {
			return err
		}
		return sdkGet(ctx, e.placeB, resp.GetRef(), data)
	}, nil
}

func sdkGet(ctx context.Context, b *sdkPod, r string, data []byte) error {
	_, obj, err := b.client.GetMapped(ctx, r)
	if err != nil {
		return err
	}
	defer obj.Close()
	got := obj.Data
	if len(got) != len(data) || (len(got) > 0 && got[len(got)-1] != data[len(data)-1]) {
		return fmt.Errorf("got %d bytes of %d", len(got), len(data))
	}
	return nil
}

func (e *env) sdkFloor(ctx context.Context, data []byte) error {
	if err := e.sdkA.client.Ping(ctx); err != nil {
		return err
	}
	if err := e.ztOne(ctx, data); err != nil {
		return err
	}
	return e.sdkB.client.Ping(ctx)
}
