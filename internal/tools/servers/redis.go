// Package servers starts real servers (redis-server, MinIO) on free
// loopback ports for tests and benchmarks, and stops them at cleanup. A
// missing binary fails with the command that installs it.
package servers

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// TB is the part of testing.TB the starters use (benchmark commands
// implement it too).
type TB interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	TempDir() string
	Cleanup(func())
}

// Redis is a running redis-server.
type Redis struct {
	Addr   string
	Client *redis.Client
	cmd    *exec.Cmd
}

// StartRedis runs redis-server without persistence in a temp dir.
func StartRedis(t TB) *Redis {
	t.Helper()
	return StartRedisOn(t, "127.0.0.1")
}

// StartRedisOn runs redis-server like StartRedis, bound to host (e.g. the
// local cluster's host address, which its pods reach), with protected mode
// off so that clients other than loopback are served without a password.
func StartRedisOn(t TB, host string) *Redis {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("redis-server not found: run hack/install-deps.sh")
	}
	port := freePortOn(t, host)
	cmd := exec.Command(bin, "--port", fmt.Sprint(port), "--bind", host, "--protected-mode", "no",
		"--save", "", "--appendonly", "no", "--dir", t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &Redis{Addr: net.JoinHostPort(host, fmt.Sprint(port)), cmd: cmd}
	r.Client = redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() {
		r.Client.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	waitUntil(t, "redis-server", func() bool { return r.Client.Ping(context.Background()).Err() == nil })
	return r
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t TB) int {
	t.Helper()
	return freePortOn(t, "127.0.0.1")
}

// A port the kernel hands out itself (a listener on port 0, the local end
// of every outgoing connection) comes from its ephemeral range: one picked
// there and released is soon taken again by another test process's
// connection, before the caller binds it ("bind: address already in use",
// seen in a CI run of the sidecar's tests). So ports are picked at random
// below that range, and below Kubernetes' NodePorts (30000-32767, which
// the local cluster's kube-proxy captures), where only other callers of
// FreePort look; the kernel's choice is the fallback.
const freePortsFrom, freePortsTo = 20000, 30000

func freePortOn(t TB, host string) int {
	t.Helper()
	if low := ephemeralLow(); low == 0 || low >= freePortsTo {
		for range 200 {
			port := freePortsFrom + rand.IntN(freePortsTo-freePortsFrom)
			// Free on every address, as servers that listen on ":port"
			// need it, and on host.
			if portFree("", port) && portFree(host, port) {
				return port
			}
		}
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func portFree(host string, port int) bool {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// ephemeralLow is the low end of the kernel's ephemeral port range (0:
// unknown).
func ephemeralLow() int {
	data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(f[0])
	return n
}

// waitUntil polls ready (bounded at 20 s) for a server that just started.
func waitUntil(t TB, what string, ready func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !ready() {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not become ready", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Pause stops the redis-server process (SIGSTOP), as a stalled node or a
// long GC pause would: connections stay open and requests queue unanswered.
// Resume (or the test's cleanup) continues it.
func (r *Redis) Pause(t TB) {
	t.Helper()
	if err := r.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.cmd.Process.Signal(syscall.SIGCONT) })
}

// Resume continues a paused redis-server (SIGCONT).
func (r *Redis) Resume(t TB) {
	t.Helper()
	if err := r.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
}
