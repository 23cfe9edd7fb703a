package localapi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi/sidecarv1"
	"github.com/ziptrail/ziptrail/internal/invocation"
)

// Client is the function container's side of the local API, as the SDKs
// use it: objects above InlineThreshold go through files in Dir.
type Client struct {
	Dir             string // the shared-memory directory (ZIPTRAIL_SHM_DIR)
	InlineThreshold int
	// Memfds: how large puts travel (objclient.go); default MemfdAuto.
	Memfds MemfdMode
	obj    *objClient // the object socket (objsock.go)
	rpc    sidecarv1.SidecarClient
	conn   *grpc.ClientConn

	id string // names this client to the sidecar, which gives its put files back

	mu           sync.Mutex
	released     []string // lent files closed since the last call (clientfiles.go)
	putLent      map[string]putFile
	putIdle      []putFile // oldest first
	putIdleBytes int64
	kept         []keptMap // mappings of released lent files, oldest first
	closed       bool

	poolOnce  sync.Once
	poolBytes int64 // idle put files kept (idleLimit)
}

// Dial connects to the sidecar's unix socket (ZIPTRAIL_SOCKET).
func Dial(socket, dir string) (*Client, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		// Invoke returns the callee's response inline (up to the envelope limit).
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(invocation.MaxEnvelopeBytes+1<<20)))
	if err != nil {
		return nil, err
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	return &Client{Dir: dir, InlineThreshold: 64 << 10, rpc: sidecarv1.NewSidecarClient(conn), conn: conn,
		id: hex.EncodeToString(id[:]), obj: &objClient{path: ObjectSocket(socket)}}, nil
}

// Close closes the connection and removes the client's idle put files.
func (c *Client) Close() error {
	c.dropPutFiles()
	c.mu.Lock()
	kept := c.kept
	c.kept, c.closed = nil, true
	c.mu.Unlock()
	for _, km := range kept {
		_ = syscall.Munmap(km.mem)
	}
	c.obj.close()
	return c.conn.Close()
}

// RPC exposes the generated client (for calls with every field).
func (c *Client) RPC() sidecarv1.SidecarClient { return c.rpc }

// Payload wraps obj for a request: inline when small, else written to a
// new file in Dir that the sidecar takes over.
func (c *Client) Payload(obj []byte) (*sidecarv1.Payload, error) {
	if len(obj) <= c.InlineThreshold {
		return inlinePayload(obj), nil
	}
	f, err := os.CreateTemp(c.Dir, "put-*")
	if err != nil {
		return nil, err
	}
	if _, err := f.Write(obj); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, err
	}
	if err := f.Close(); err != nil {
		os.Remove(f.Name())
		return nil, err
	}
	return pathPayload(f.Name()), nil
}

// Bytes returns a response's object, reading and removing its file.
func (c *Client) Bytes(p *sidecarv1.Payload) ([]byte, error) {
	switch src := p.GetSource().(type) {
	case *sidecarv1.Payload_Inline:
		return src.Inline, nil
	case *sidecarv1.Payload_Path:
		defer os.Remove(src.Path)
		return os.ReadFile(src.Path)
	default:
		return nil, fmt.Errorf("local API: response without an object")
	}
}

// Put buffers obj in the pod for n reads and returns its reference.
func (c *Client) Put(ctx context.Context, obj []byte, n uint32) (string, error) {
	resp, err := c.PutObject(ctx, obj, &sidecarv1.PutRequest{Reads: n})
	if err != nil {
		return "", err
	}
	return resp.GetRef(), nil
}

// Get retrieves a referenced object.
func (c *Client) Get(ctx context.Context, ref string) ([]byte, error) {
	resp, err := c.rpc.Get(ctx, &sidecarv1.GetRequest{Ref: ref})
	if err != nil {
		return nil, err
	}
	return c.Bytes(resp.GetObject())
}

// SendObject puts obj into a bucket of the session.
func (c *Client) SendObject(ctx context.Context, session, bucket, key string, obj []byte, persist bool) (*sidecarv1.SendObjectResponse, error) {
	p, err := c.Payload(obj)
	if err != nil {
		return nil, err
	}
	resp, err := c.rpc.SendObject(ctx, &sidecarv1.SendObjectRequest{Session: session, Bucket: bucket, Key: key, Object: p, Persist: persist})
	if err != nil {
		c.discard(p)
	}
	return resp, err
}

// GetObject reads an object of a bucket by key.
func (c *Client) GetObject(ctx context.Context, session, bucket, key string) ([]byte, error) {
	resp, err := c.rpc.GetObject(ctx, &sidecarv1.GetObjectRequest{Session: session, Bucket: bucket, Key: key})
	if err != nil {
		return nil, err
	}
	return c.Bytes(resp.GetObject())
}

// Invoke calls the function at url with obj and returns its response.
func (c *Client) Invoke(ctx context.Context, url, function string, obj []byte) (*sidecarv1.InvokeResponse, error) {
	p, err := c.Payload(obj)
	if err != nil {
		return nil, err
	}
	resp, err := c.rpc.Invoke(ctx, &sidecarv1.InvokeRequest{Url: url, Function: function, Object: p})
	if err != nil {
		c.discard(p)
	}
	return resp, err
}

// discard removes a payload file the sidecar refused before taking it.
func (c *Client) discard(p *sidecarv1.Payload) {
	if path := p.GetPath(); path != "" {
		_ = os.Remove(path)
	}
}
