// Command gofunc is bench/chain's function written with the Go SDK (the
// image ghcr.io/ziptrail/bench-chain-go of config/local/images.yaml, for
// `bench/chain -lang go`), so that a chain of Go functions shows the
// platform's cost without the Python interpreter's. With RING_STEPS set it
// is step RING_INDEX of a ring of RING_SIZE functions (bench/chain's
// ringHandler): it counts the step in the object and hands it to the next
// function's bucket, or to the output bucket after RING_STEPS steps;
// without, a step of a chain (handler): its input is its return value.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	index, _ := strconv.Atoi(os.Getenv("RING_INDEX"))
	size, _ := strconv.Atoi(os.Getenv("RING_SIZE"))
	steps, _ := strconv.Atoi(os.Getenv("RING_STEPS"))
	err := ziptrail.Serve(ctx, func(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
		if len(inv.Objects) == 0 {
			return nil, errors.New("no input object")
		}
		in := inv.Objects[0].Bytes()
		if steps == 0 {
			return append([]byte(nil), in...), nil
		}
		n, err := strconv.Atoi(string(in))
		if err != nil {
			return nil, fmt.Errorf("input %q: %w", in, err)
		}
		n++
		s := strconv.Itoa(n)
		if n >= steps {
			return nil, ziptrail.SendObject(ctx, "output", "result", []byte(s), nil)
		}
		return nil, ziptrail.SendObject(ctx, fmt.Sprintf("h%d", (index+1)%max(size, 1)), s, []byte(s), nil)
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "gofunc:", err)
		os.Exit(1)
	}
}
