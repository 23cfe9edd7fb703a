// Command fn is the k-of-n straggler mitigation sample's functions, one
// binary with three roles (the first argument):
//
//	dispatch  the session input -> REPLICAS identical requests in bucket
//	          "requests" (an Immediate trigger runs a worker for each)
//	worker    one request -> its answer in bucket "answers"; the last
//	          replica is a straggler that takes STRAGGLER_DELAY
//	vote      the first K answers (a Redundant trigger fires once K of
//	          REPLICAS arrived) -> the majority answer in bucket "output"
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"os/signal"
	"sort"
	"syscall"
	"time"

	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

const replicas = 5

func dispatch(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
	for i := 0; i < replicas; i++ {
		if err := ziptrail.SendObject(ctx, "requests", fmt.Sprintf("replica-%d", i), inv.Objects[0].Bytes(), nil); err != nil {
			return nil, err
		}
	}
	return nil, nil
}

func worker(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
	req := inv.Objects[0]
	if req.Key == fmt.Sprintf("replica-%d", replicas-1) {
		delay, err := time.ParseDuration(envOr("STRAGGLER_DELAY", "5s"))
		if err != nil {
			return nil, err
		}
		select { // a slow node, a cold cache, a noisy neighbour
		case <-time.After(delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	sum := sha256.Sum256(req.Bytes()) // the "work"
	return nil, ziptrail.SendObject(ctx, "answers", req.Key, []byte(hex.EncodeToString(sum[:])), nil)
}

func vote(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
	votes := map[string]int{}
	var from []string
	for _, o := range inv.Objects {
		votes[string(o.Bytes())]++
		from = append(from, o.Key)
	}
	sort.Strings(from)
	answer, n := "", 0
	for a, c := range votes {
		if c > n || (c == n && a < answer) {
			answer, n = a, c
		}
	}
	out, err := json.Marshal(map[string]any{"answer": answer, "votes": n, "answered": from, "replicas": replicas})
	if err != nil {
		return nil, err
	}
	return nil, ziptrail.SendObject(ctx, "output", "result", out, nil)
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func main() {
	roles := map[string]ziptrail.Handler{"dispatch": dispatch, "worker": worker, "vote": vote}
	if len(os.Args) != 2 || roles[os.Args[1]] == nil {
		log.Fatalf("usage: fn dispatch|worker|vote")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := ziptrail.Serve(ctx, roles[os.Args[1]]); err != nil {
		log.Fatal(err)
	}
}
