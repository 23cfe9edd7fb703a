package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// startRedis runs a real redis-server on a free loopback port.
func startRedis(t *testing.T) *redis.Client {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("redis-server not found: run hack/install-deps.sh")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command(bin, "--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port)})
	t.Cleanup(func() { c.Close() })
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatal("redis-server did not start")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return c
}

func TestSaveLoadAndFencing(t *testing.T) {
	ctx := context.Background()
	s := &Store{Client: startRedis(t), Key: "ziptrail:test"}
	if _, _, found, err := s.Load(ctx); err != nil || found {
		t.Fatalf("empty store: found=%v err=%v", found, err)
	}
	if err := s.Save(ctx, 1, []byte("one")); err != nil {
		t.Fatal(err)
	}
	if err := s.Save(ctx, 2, []byte("two\x00binary")); err != nil {
		t.Fatal(err)
	}
	data, gen, found, err := s.Load(ctx)
	if err != nil || !found || gen != 2 || string(data) != "two\x00binary" {
		t.Fatalf("load: %q %d %v %v", data, gen, found, err)
	}
	// A deposed leader still at generation 2 cannot overwrite.
	if err := s.Save(ctx, 2, []byte("stale")); !errors.Is(err, ErrStale) {
		t.Errorf("same generation: %v, want ErrStale", err)
	}
	if err := s.Save(ctx, 1, []byte("older")); !errors.Is(err, ErrStale) {
		t.Errorf("older generation: %v, want ErrStale", err)
	}
	if data, _, _, _ := s.Load(ctx); string(data) != "two\x00binary" {
		t.Errorf("after stale writes: %q", data)
	}
}
