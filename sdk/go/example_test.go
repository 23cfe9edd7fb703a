package ziptrail_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"strings"

	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// The examples run in a function container next to its queue-proxy-zl
// sidecar (ZIPTRAIL_SOCKET, ZIPTRAIL_SHM_DIR); they are compiled, not run,
// by go test. The package's tests run the same calls against real sidecars.

// A function: it counts the words of its input and sends one object per
// word to the "pairs" bucket, grouped by word for a DynamicGroup trigger.
func Example() {
	err := ziptrail.Serve(context.Background(), func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
		words := strings.Fields(string(inv.Objects[0].Bytes())) // mapped, not copied
		for i, w := range words {
			obj := ziptrail.CreateObject("pairs", fmt.Sprintf("%s-%d", inv.ID, i)).SetData([]byte("1")).SetGroup(w)
			if err := obj.Send(ctx, false); err != nil {
				return nil, err
			}
		}
		return fmt.Appendf(nil, "%d words", len(words)), nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

// Put an object for two readers, hand its reference to them; Get it.
func ExamplePut() {
	ctx := context.Background()
	ref, err := ziptrail.Put(ctx, bytes.Repeat([]byte("x"), 10<<20), 2)
	if err != nil {
		log.Fatal(err)
	}
	obj, err := ziptrail.Get(ctx, ref) // in any pod of the namespace
	if err != nil {
		log.Fatal(err)
	}
	defer obj.Close()
	fmt.Println(len(obj.Bytes()), obj.Mapped())
}

// Errors are typed: react to the class, show the message.
func ExampleGet_errors() {
	_, err := ziptrail.Get(context.Background(), "zt1.tampered")
	switch {
	case errors.Is(err, ziptrail.ErrBadReference):
		log.Printf("not a reference of this namespace: %v", err)
	case errors.Is(err, ziptrail.ErrExpired), errors.Is(err, ziptrail.ErrExhausted):
		log.Printf("too late: %v", err)
	case errors.Is(err, ziptrail.ErrProducerGone):
		log.Printf("the producer's pod is gone and no tier kept the object: %v", err)
	}
}

// Invoke a function by URL with a large object: its pod pulls the object
// from this one.
func ExampleInvoke() {
	resp, err := ziptrail.Invoke(context.Background(), "http://resize.default.svc.cluster.local", make([]byte, 100<<20),
		ziptrail.WithObjectName("images", "cat.png"), ziptrail.WithArgs([]byte(`{"width":64}`)))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(resp.StatusCode, string(resp.Body))
}

// Send one object to many functions from a single put.
func ExampleBroadcast() {
	urls := []string{"http://score-a.default.svc.cluster.local", "http://score-b.default.svc.cluster.local"}
	resps, err := ziptrail.Broadcast(context.Background(), urls, []byte("the model"))
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range resps {
		fmt.Println(string(r.Body))
	}
}

// Fill a large object in shared memory directly, then put it: the bytes
// are never in the Go heap.
func ExampleClient_Alloc() {
	c, err := ziptrail.Connect()
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	buf, err := c.Alloc(1 << 30)
	if err != nil {
		log.Fatal(err)
	}
	for i := range buf.Bytes() {
		buf.Bytes()[i] = byte(i)
	}
	ref, err := buf.Put(context.Background(), 1)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(ref)
}

// Declare the expected set of a DynamicJoin, persist an object, read one
// back by key.
func ExampleCreateObject() {
	ctx := context.Background()
	if err := ziptrail.CreateObject("parts", "plan").ExpectKeys("p1", "p2").DeclareOnly().Send(ctx, false); err != nil {
		log.Fatal(err)
	}
	if err := ziptrail.CreateObject("models", "latest").SetData([]byte("weights")).Send(ctx, true); err != nil {
		log.Fatal(err)
	}
	obj, err := ziptrail.GetObject(ctx, "models", "latest")
	if err != nil {
		log.Fatal(err)
	}
	defer obj.Close()
	fmt.Println(string(obj.Bytes()))
}
