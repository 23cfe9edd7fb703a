package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"time"

	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// The direct arm's ping-pong with its two ends in two processes, as two
// pods' functions are: rank 0 is a goroutine of the bench, rank 1 a child
// process of it (the bench binary again, with echoEnv set) using the Go
// SDK on pod 1's socket.

const echoEnv = "ZT_BENCH_ECHO"

// echoJob is what the child is told (JSON in echoEnv).
type echoJob struct {
	Socket, Shm, Group string
	Total              int
	Recycle            bool // join WithRecycledBuffers
}

// runEchoChild is the child's main: join as rank 1, echo Total messages
// (every page read), leave. It never returns.
func runEchoChild(spec string) {
	err := func() error {
		var j echoJob
		if err := json.Unmarshal([]byte(spec), &j); err != nil {
			return err
		}
		c, err := ziptrail.NewClient(ziptrail.Config{Socket: j.Socket, ShmDir: j.Shm})
		if err != nil {
			return err
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		opts := []ziptrail.JoinOption{ziptrail.WithWaitAll(), ziptrail.WithJoinTimeout(time.Minute)}
		if j.Recycle {
			opts = append(opts, ziptrail.WithRecycledBuffers())
		}
		g, err := c.Join(ctx, session, j.Group, 1, 2, opts...)
		if err != nil {
			return err
		}
		defer g.Leave(context.Background())
		return echo(ctx, g, j.Total)
	}()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench echo child:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// pingPongProcs is pingPong with rank 1 in a child process.
func (z *ztBench) pingPongProcs(ctx context.Context, data []byte, n int) ([]float64, error) {
	return z.pingPongChild(ctx, data, n, false)
}

// pingPongProcsRecycled is pingPongProcs with both ends joined
// WithRecycledBuffers.
func (z *ztBench) pingPongProcsRecycled(ctx context.Context, data []byte, n int) ([]float64, error) {
	return z.pingPongChild(ctx, data, n, true)
}

func (z *ztBench) pingPongChild(ctx context.Context, data []byte, n int, recycle bool) ([]float64, error) {
	total := n + warmups
	group := z.group("procs")
	spec, _ := json.Marshal(echoJob{Socket: z.pods[1].socket, Shm: z.pods[1].shm, Group: group, Total: total, Recycle: recycle})
	child := exec.CommandContext(ctx, os.Args[0])
	child.Env = append(os.Environ(), echoEnv+"="+string(spec))
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		return nil, err
	}
	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()
	defer func() {
		_ = child.Process.Kill()
	}()
	jctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	opts := []ziptrail.JoinOption{ziptrail.WithWaitAll(), ziptrail.WithJoinTimeout(time.Minute)}
	if recycle {
		opts = append(opts, ziptrail.WithRecycledBuffers())
	}
	a, err := z.pods[0].client.Join(jctx, session, group, 0, 2, opts...)
	if err != nil {
		return nil, err
	}
	defer leaveAll([]*ziptrail.Group{a})
	rtts, err := roundTrips(ctx, a, data, n, func() error {
		select {
		case err := <-exited:
			return fmt.Errorf("the echo process ended (%v)", err)
		default:
			return nil
		}
	})
	if err != nil {
		return nil, err
	}
	if err := <-exited; err != nil {
		return nil, fmt.Errorf("the echo process: %w", err)
	}
	return rtts, nil
}
