package ziptrail

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// maxParallel bounds the calls a fan-out runs at once: enough to overlap
// transfers, few enough not to flood the sidecar with streams.
const maxParallel = 32

// parallel runs f(0..n-1) with at most maxParallel at once and joins the
// errors, each prefixed with its index.
func parallel(n int, f func(i int) error) error {
	errs := make([]error, n)
	sem := make(chan struct{}, maxParallel)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := f(i); err != nil {
				errs[i] = fmt.Errorf("#%d: %w", i, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Scatter invokes the function at url once per object, in parallel: each
// object is put once, for one read, and pulled by the pod that serves its
// call. Responses are in the order of objs; a failed call leaves its
// slot nil (or holds the failing response) and joins its error (each
// satisfies errors.Is with its kind).
func (c *Client) Scatter(ctx context.Context, url string, objs [][]byte, opts ...Option) ([]*Response, error) {
	urls := make([]string, len(objs))
	for i := range urls {
		urls[i] = url
	}
	return c.ScatterTo(ctx, urls, objs, opts...)
}

// ScatterTo invokes urls[i] with objs[i], in parallel; see Scatter.
func (c *Client) ScatterTo(ctx context.Context, urls []string, objs [][]byte, opts ...Option) ([]*Response, error) {
	if len(urls) != len(objs) {
		return nil, &Error{Kind: KindInvalid, Op: "scatter", Err: fmt.Errorf("%d URLs for %d objects", len(urls), len(objs))}
	}
	out := make([]*Response, len(objs))
	err := parallel(len(objs), func(i int) (err error) {
		out[i], err = c.Invoke(ctx, urls[i], objs[i], opts...)
		return err
	})
	return out, err
}

// Gather gets every referenced object, in parallel, in the order of refs.
// On any error the objects already mapped are closed and none is returned.
func (c *Client) Gather(ctx context.Context, refs []string) ([]*Object, error) {
	out := make([]*Object, len(refs))
	err := parallel(len(refs), func(i int) (err error) {
		out[i], err = c.Get(ctx, refs[i])
		return err
	})
	if err != nil {
		for _, o := range out {
			if o != nil {
				_ = o.Close()
			}
		}
		return nil, err
	}
	return out, nil
}

// Broadcast invokes every URL with the same object, in parallel, from one
// Put allowing len(urls) reads: the bytes are buffered once, and each
// callee's pod pulls its own copy. Calls that fail before their pod read
// the object leave it buffered until its TTL (WithTTL bounds it).
func (c *Client) Broadcast(ctx context.Context, urls []string, obj []byte, opts ...Option) ([]*Response, error) {
	if len(urls) == 0 {
		return nil, nil
	}
	ref, err := c.Put(ctx, obj, len(urls), opts...)
	if err != nil {
		return nil, err
	}
	out := make([]*Response, len(urls))
	err = parallel(len(urls), func(i int) (err error) {
		out[i], err = c.InvokeRef(ctx, urls[i], ref, opts...)
		return err
	})
	return out, err
}

// Scatter invokes url once per object through the default client.
func Scatter(ctx context.Context, url string, objs [][]byte, opts ...Option) ([]*Response, error) {
	c, err := must("scatter")
	if err != nil {
		return nil, err
	}
	return c.Scatter(ctx, url, objs, opts...)
}

// Gather gets every referenced object through the default client.
func Gather(ctx context.Context, refs []string) ([]*Object, error) {
	c, err := must("gather")
	if err != nil {
		return nil, err
	}
	return c.Gather(ctx, refs)
}

// Broadcast invokes every URL with one put object through the default
// client.
func Broadcast(ctx context.Context, urls []string, obj []byte, opts ...Option) ([]*Response, error) {
	c, err := must("broadcast")
	if err != nil {
		return nil, err
	}
	return c.Broadcast(ctx, urls, obj, opts...)
}
