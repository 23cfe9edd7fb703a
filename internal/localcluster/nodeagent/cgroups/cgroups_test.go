package cgroups_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/localcluster/nodeagent/cgroups"
)

// hierarchy is the host's cgroup hierarchy; the tests need root and a
// writable memory or cpu controller.
func hierarchy(t *testing.T) *cgroups.Hierarchy {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("cgroups need root")
	}
	h, err := cgroups.Detect()
	if err != nil {
		t.Skipf("cgroups are not usable here: %v", err)
	}
	return h
}

// testGroup is a group of the test's own below the process's cgroup,
// removed at the end.
func testGroup(t *testing.T, h *cgroups.Hierarchy) *cgroups.Group {
	t.Helper()
	g, err := h.Own().Child(fmt.Sprintf("ziptrail-cgroups-test-%d-%s", os.Getpid(), t.Name()), cgroups.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := g.Remove(ctx); err != nil {
			t.Error(err)
		}
	})
	return g
}

func read(t *testing.T, dir, file string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// joined runs a shell that writes its pid into the group's cgroup.procs
// files and then execs script, as the container init does.
func joined(g *cgroups.Group, script string) *exec.Cmd {
	args := []string{"-c", `for d in "$@"; do echo $$ > "$d/cgroup.procs" || exit 99; done; exec ` + script, "sh"}
	return exec.Command("sh", append(args, g.Dirs()...)...)
}

// Detect finds the process's own cgroup: it exists, and the process is in it.
func TestDetect(t *testing.T) {
	h := hierarchy(t)
	own := h.Own()
	if len(own.Dirs()) == 0 || !own.Exists() {
		t.Fatalf("own cgroup dirs %v", own.Dirs())
	}
	pids, err := own.Pids()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range pids {
		found = found || p == os.Getpid()
	}
	if !found {
		t.Fatalf("pid %d not among %v (controllers %v)", os.Getpid(), pids, h.Controllers())
	}
}

// A child's limits are written to its control files; a process that
// allocates past the memory limit is OOM-killed and counted; Remove takes
// the cgroups away.
func TestLimitsAndOOMKill(t *testing.T) {
	h := hierarchy(t)
	g := testGroup(t, h)
	c, err := g.Child("c", cgroups.Limits{MemoryBytes: 16 << 20, CPUQuotaMicros: 20000, CPUShares: 512})
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range c.Dirs() {
		switch h.Version() {
		case 1:
			if _, err := os.Stat(filepath.Join(dir, "memory.limit_in_bytes")); err == nil {
				if got := read(t, dir, "memory.limit_in_bytes"); got != "16777216" {
					t.Errorf("memory.limit_in_bytes %s", got)
				}
			}
			if _, err := os.Stat(filepath.Join(dir, "cpu.cfs_quota_us")); err == nil {
				if got := read(t, dir, "cpu.cfs_quota_us") + "/" + read(t, dir, "cpu.cfs_period_us"); got != "20000/100000" {
					t.Errorf("quota/period %s", got)
				}
				if got := read(t, dir, "cpu.shares"); got != "512" {
					t.Errorf("cpu.shares %s", got)
				}
			}
		case 2:
			if got := read(t, dir, "memory.max"); got != "16777216" {
				t.Errorf("memory.max %s", got)
			}
			if got := read(t, dir, "cpu.max"); got != "20000 100000" {
				t.Errorf("cpu.max %s", got)
			}
		}
	}
	before, err := c.OOMKills()
	if errors.Is(err, cgroups.ErrNoOOMCount) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	// dd reads 64 MiB from /dev/zero into one buffer: every page is touched.
	cmd := joined(c, "dd if=/dev/zero of=/dev/null bs=64M count=1")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("dd was not stopped (%v): %s", err, out)
	}
	ws := ee.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("dd ended with %v, want SIGKILL: %s", ee, out)
	}
	after, err := c.OOMKills()
	if err != nil {
		t.Fatal(err)
	}
	if after != before+1 {
		t.Fatalf("OOM kills %d → %d, want one more", before, after)
	}

	// Below the limit nothing is killed.
	if out, err := joined(c, "dd if=/dev/zero of=/dev/null bs=4M count=1").CombinedOutput(); err != nil {
		t.Fatalf("dd of 4 MiB under a 16 MiB limit: %v: %s", err, out)
	}
	if n, _ := c.OOMKills(); n != after {
		t.Fatalf("OOM kills %d after a run below the limit, want %d", n, after)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	if g.Exists() || c.Exists() {
		t.Fatalf("still there: %v", c.Dirs())
	}
}

// Remove kills what still runs in the group (and below it) first.
func TestRemoveKillsLeftovers(t *testing.T) {
	h := hierarchy(t)
	g := testGroup(t, h)
	c, err := g.Child("c", cgroups.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	cmd := joined(c, "sleep 600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// The shell has joined once its pid is listed.
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids, _ := c.Pids()
		if len(pids) == 1 && pids[0] == cmd.Process.Pid {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the process did not join: %v", pids)
		}
		time.Sleep(20 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil {
		t.Fatal("sleep survived Remove")
	}
	if g.Exists() {
		t.Fatalf("still there: %v", g.Dirs())
	}
}

func TestNamesAndOwn(t *testing.T) {
	h := hierarchy(t)
	for _, bad := range []string{"", ".", "..", "a/b"} {
		if _, err := h.Own().Child(bad, cgroups.Limits{}); err == nil {
			t.Errorf("Child(%q) accepted", bad)
		}
	}
	if err := h.Own().Remove(context.Background()); err == nil {
		t.Error("Remove of the agent's own cgroup accepted")
	}
	if got := h.Own().Sub(cgroups.NodeGroup("n0")).Sub(cgroups.PodGroup("u1")).Sub("c").Path(); got != "ziptrail-nodeagent-n0/podu1/c" {
		t.Errorf("path %q", got)
	}
}

func TestSharesToWeight(t *testing.T) {
	for shares, want := range map[uint64]uint64{0: 1, 2: 1, 1024: 39, 262144: 10000, 1 << 30: 10000} {
		if got := cgroups.SharesToWeight(shares); got != want {
			t.Errorf("SharesToWeight(%d) = %d, want %d", shares, got, want)
		}
	}
}
