package ziptrail

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi/sidecarv1"
	"github.com/ziptrail/ziptrail/internal/invocation"
)

// Metadata keys the trigger engine reads (internal/engine).
const (
	// MetaGroup names an object's group for a DynamicGroup trigger whose
	// groupMetadataKey is unset (its default); SetGroupKey serves others.
	MetaGroup = "group"
	// MetaExpectedKeys declares, for DynamicJoin, the comma-separated keys
	// the join waits for.
	MetaExpectedKeys = "ziptrail.expected-keys"
	// MetaExpectedCount declares, for DynamicJoin, how many objects the
	// join waits for.
	MetaExpectedCount = "ziptrail.expected-count"
	// MetaDeclareOnly marks an object that only declares DynamicJoin's
	// expected set and is no member of it.
	MetaDeclareOnly = "ziptrail.declare-only"
)

// BucketObject is an object being written to a bucket of the workflow
// (Pheromone's create_object). Build it, then Send it.
type BucketObject struct {
	Bucket, Key string
	Data        []byte
	Metadata    map[string]string
}

// CreateObject starts an object for bucket under key.
func CreateObject(bucket, key string) *BucketObject {
	return &BucketObject{Bucket: bucket, Key: key}
}

// Write appends to the object's data (so encoders can write into it).
func (o *BucketObject) Write(p []byte) (int, error) {
	o.Data = append(o.Data, p...)
	return len(p), nil
}

// SetData replaces the object's data (not copied until Send).
func (o *BucketObject) SetData(data []byte) *BucketObject {
	o.Data = data
	return o
}

// SetMetadata sets one metadata entry.
func (o *BucketObject) SetMetadata(key, value string) *BucketObject {
	if o.Metadata == nil {
		o.Metadata = map[string]string{}
	}
	o.Metadata[key] = value
	return o
}

// SetGroup puts the object into a DynamicGroup group (metadata "group").
func (o *BucketObject) SetGroup(group string) *BucketObject { return o.SetMetadata(MetaGroup, group) }

// SetGroupKey puts the object into a group of a DynamicGroup trigger whose
// groupMetadataKey is metaKey.
func (o *BucketObject) SetGroupKey(metaKey, group string) *BucketObject {
	return o.SetMetadata(metaKey, group)
}

// ExpectKeys declares the keys a DynamicJoin on this bucket waits for.
func (o *BucketObject) ExpectKeys(keys ...string) *BucketObject {
	return o.SetMetadata(MetaExpectedKeys, strings.Join(keys, ","))
}

// ExpectCount declares how many objects a DynamicJoin on this bucket waits
// for.
func (o *BucketObject) ExpectCount(n int) *BucketObject {
	return o.SetMetadata(MetaExpectedCount, strconv.Itoa(n))
}

// DeclareOnly marks the object as a declaration of DynamicJoin's expected
// set, not a member of it.
func (o *BucketObject) DeclareOnly() *BucketObject { return o.SetMetadata(MetaDeclareOnly, "true") }

// Send sends the object to its bucket (Pheromone's send_object); the
// bucket's triggers decide what it invokes. It takes one of two paths:
//
//   - In a handler without persist: the object travels back with the
//     invocation's response, so the engine sees it together with the
//     invocation's end — what DynamicGroup and re-execution rules rely
//     on. One over 1 MiB is put into the pod's store at once and only its
//     reference goes with the response (no cap but the store's); the
//     sidecar turns smaller ones over the inline threshold into references.
//   - With persist, or outside a handler: through the sidecar's local API
//     (Client.SendObject), which buffers it now, reports it to the
//     operator and, with persist, also writes it to the bucket's slow tier
//     (so GetObject finds it after this pod is gone).
//
// The data is copied either way.
func (o *BucketObject) Send(ctx context.Context, persist bool) error {
	if outs, ok := ctx.Value(outputsKey{}).(*outputs); ok && !persist {
		return outs.add(ctx, o)
	}
	c, err := must("send object")
	if err != nil {
		return err
	}
	_, err = c.SendObject(ctx, o, persist)
	return err
}

// Sent is what the sidecar did with a sent object.
type Sent struct {
	Ref       string // the object's reference; empty when small enough to travel inline
	Size      int64
	Persisted bool
}

// SendObject sends obj through the sidecar's local API (see
// BucketObject.Send for when to prefer the response path). The session
// and invocation are the context's, or WithSession's.
func (c *Client) SendObject(ctx context.Context, obj *BucketObject, persist bool, opts ...Option) (*Sent, error) {
	if err := obj.check(); err != nil {
		return nil, err
	}
	p, err := c.api.Payload(obj.Data)
	if err != nil {
		return nil, &Error{Kind: KindInternal, Op: "send object", Err: err}
	}
	req := &sidecarv1.SendObjectRequest{Session: collect(ctx, opts).session, Bucket: obj.Bucket, Key: obj.Key, Object: p,
		Persist: persist, Metadata: obj.Metadata}
	if inv, ok := CurrentInvocation(ctx); ok {
		req.InvocationId = inv.ID
	}
	resp, err := c.api.RPC().SendObject(ctx, req)
	if err != nil {
		discard(p)
		return nil, rpcError(ctx, "send object", err)
	}
	return &Sent{Ref: resp.GetRef(), Size: resp.GetSize(), Persisted: resp.GetPersisted()}, nil
}

// GetObject reads an object of a bucket by key (Pheromone's get_object):
// one sent through this pod's sidecar in the session, else a persisted
// one. Inputs of an invocation are in Invocation.Objects instead.
func (c *Client) GetObject(ctx context.Context, bucket, key string, opts ...Option) (*Object, error) {
	resp, m, err := c.api.GetObjectMapped(ctx, collect(ctx, opts).session, bucket, key)
	if err != nil {
		return nil, rpcError(ctx, "get object", err)
	}
	obj := lentObject(resp, m)
	obj.Bucket, obj.Key = bucket, key
	return obj, nil
}

// GetObject reads a bucket's object through the default client; see
// Client.GetObject.
func GetObject(ctx context.Context, bucket, key string, opts ...Option) (*Object, error) {
	c, err := must("get object")
	if err != nil {
		return nil, err
	}
	return c.GetObject(ctx, bucket, key, opts...)
}

// SendObject sends data to bucket under key from a handler, with optional
// metadata; shorthand for CreateObject(bucket, key) with the data and
// metadata, then Send(ctx, false). Outside a handler it fails: use
// BucketObject.Send or Client.SendObject there.
func SendObject(ctx context.Context, bucket, key string, data []byte, metadata map[string]string) error {
	outs, ok := ctx.Value(outputsKey{}).(*outputs)
	if !ok {
		return &Error{Kind: KindNotFound, Op: "send object", Err: errors.New("called outside a function invocation (use CreateObject(...).Send or Client.SendObject)")}
	}
	return outs.add(ctx, &BucketObject{Bucket: bucket, Key: key, Data: data, Metadata: metadata})
}

func (o *BucketObject) check() error {
	if o.Bucket == "" || o.Key == "" {
		return &Error{Kind: KindInvalid, Op: "send object", Err: errors.New("bucket and key are required")}
	}
	return nil
}

// byReference: objects a handler sends larger than this go into the pod's
// shared memory through the sidecar (Put) and travel in the response as a
// reference: no copy in the response, and no cap but the pod's object
// store (the response's is 64 MiB). Python: BY_REFERENCE in
// ziptrail/server.py.
const byReference = 1 << 20

// add collects an object sent during the invocation; it returns with the
// response. A large one is put into the pod's object store for the
// session now (freed with the session or its TTL, as the sidecar's own
// copies of outputs are), and only its reference waits for the response;
// without a sidecar (a handler served alone, as in a unit test) it is
// kept inline.
func (outs *outputs) add(ctx context.Context, o *BucketObject) error {
	if err := o.check(); err != nil {
		return err
	}
	obj := invocation.Object{Bucket: o.Bucket, Key: o.Key, Size: int64(len(o.Data)), Metadata: maps.Clone(o.Metadata)}
	if len(o.Data) > byReference {
		if c, err := Default(); err == nil && c.hasSidecar() {
			var opts []Option
			if inv, ok := CurrentInvocation(ctx); ok {
				opts = append(opts, WithSession(inv.Session))
			}
			ref, err := c.Put(ctx, o.Data, math.MaxUint32, opts...)
			if err != nil {
				return fmt.Errorf("send object %s/%s (%d bytes) by reference: %w", o.Bucket, o.Key, len(o.Data), err)
			}
			obj.Ref = ref
		}
	}
	if obj.Ref == "" {
		obj.Inline = append([]byte{}, o.Data...)
	}
	outs.mu.Lock()
	defer outs.mu.Unlock()
	outs.objects = append(outs.objects, obj)
	return nil
}

// hasSidecar is whether c's sidecar socket exists (connecting is lazy).
func (c *Client) hasSidecar() bool {
	_, err := os.Stat(c.socket)
	return err == nil
}
