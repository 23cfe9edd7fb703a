// Package cgroups gives the node agent's pods and containers cgroups with
// their resource limits, as a kubelet does: one cgroup per pod with the
// pod's limits and, inside it, one per container with the container's.
//
// Everything lives below the agent's own cgroup in each hierarchy (as
// /proc/self/cgroup names it), never at a hierarchy's root, so nothing
// outside the agent's part of the tree is touched:
//
//	<own>/ziptrail-nodeagent-<node>/pod<uid>/<container>
//
// Two layouts are supported behind the driver interface: cgroup v1 (the
// memory, cpu and cpuacct controllers, each on its own hierarchy or
// co-mounted; v1.go) and cgroup v2 (the unified hierarchy, with memory and
// cpu enabled through cgroup.subtree_control; v2.go). A process joins a
// cgroup by writing its pid into the cgroup's cgroup.procs; the node agent
// has the container's init do it before it execs the container's command
// (package sandbox), so nothing runs outside the limits.
package cgroups

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Limits are what one cgroup enforces; a zero field leaves the kernel's
// default (no limit, default weight).
type Limits struct {
	// MemoryBytes is memory.limit_in_bytes (v1) or memory.max (v2). Swap is
	// not allowed on top of it (memory.memsw.limit_in_bytes,
	// memory.swap.max), as with the kubelet's default NoSwap.
	MemoryBytes int64
	// CPUQuotaMicros is the CPU time allowed per CPUPeriodMicros:
	// cpu.cfs_quota_us (v1) or cpu.max (v2).
	CPUQuotaMicros int64
	// CPUShares is the relative weight on v1's scale (2–262144):
	// cpu.shares (v1), or cpu.weight (v2) converted as the kubelet does.
	CPUShares uint64
}

// CPUPeriodMicros is the CFS period every quota refers to (the kubelet's).
const CPUPeriodMicros = 100000

// ErrNoOOMCount is returned by OOMKills when the kernel does not count OOM
// kills per cgroup (v1 memory.oom_control has no oom_kill line before 4.13).
var ErrNoOOMCount = errors.New("the kernel does not count OOM kills per cgroup")

// driver is one cgroup version's layout. rel is a slash-separated path
// below the agent's own cgroup ("" is the agent's own cgroup).
type driver interface {
	version() int
	controllers() []string
	// dirs are the directories of the cgroup at rel in every hierarchy
	// the driver uses.
	dirs(rel string) []string
	// create makes the cgroup at rel (its parent exists) when it is
	// missing and applies l.
	create(rel string, l Limits) error
	oomKills(rel string) (uint64, error)
	cpuUsage(rel string) (time.Duration, error)
}

// Hierarchy is the part of the host's cgroup tree the agent may use: its
// own cgroup in each hierarchy that has a controller it needs.
type Hierarchy struct {
	d driver
}

// Detect finds the cgroup hierarchies of this host and the process's own
// cgroups in them. It fails when neither a memory nor a cpu controller is
// mounted with a writable cgroup of the process. cgroup v1 wins where the
// memory or cpu controller is on a v1 hierarchy (hybrid hosts keep them
// there); otherwise the unified (v2) hierarchy is used.
func Detect() (*Hierarchy, error) {
	mounts, err := readMountinfo("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	own, err := readProcCgroup("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	d1, err1 := newV1(mounts, own)
	if err1 == nil {
		return &Hierarchy{d: d1}, nil
	}
	d2, err2 := newV2(mounts, own)
	if err2 == nil {
		return &Hierarchy{d: d2}, nil
	}
	return nil, fmt.Errorf("no usable cgroup controller: v1: %w; v2: %w", err1, err2)
}

// Version is 1 or 2.
func (h *Hierarchy) Version() int { return h.d.version() }

// Controllers are the controllers the agent uses.
func (h *Hierarchy) Controllers() []string { return h.d.controllers() }

// Own is the agent's own cgroup. The agent never creates, changes or
// removes it; its groups go below it.
func (h *Hierarchy) Own() *Group { return &Group{h: h} }

// NodeGroup is the name of a node's group below the agent's own cgroup.
func NodeGroup(node string) string { return "ziptrail-nodeagent-" + node }

// PodGroup is the name of a pod's group below its node's.
func PodGroup(uid string) string { return "pod" + uid }

// Group is one cgroup below the agent's own, in every hierarchy the agent
// uses. A Group value is only a name: Child creates the cgroup.
type Group struct {
	h   *Hierarchy
	rel string
}

func validName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
		return fmt.Errorf("invalid cgroup name %q", name)
	}
	return nil
}

// Sub names the cgroup name below g without creating it.
func (g *Group) Sub(name string) *Group {
	return &Group{h: g.h, rel: path.Join(g.rel, name)}
}

// Child creates the cgroup name below g, if it is missing, and applies l
// (again, when it exists).
func (g *Group) Child(name string, l Limits) (*Group, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	c := g.Sub(name)
	if err := g.h.d.create(c.rel, l); err != nil {
		return nil, fmt.Errorf("cgroup %s: %w", c.rel, err)
	}
	return c, nil
}

// Path is g's path below the agent's own cgroup.
func (g *Group) Path() string { return g.rel }

// Dirs are g's directories, one per hierarchy; a process joins g by
// writing its pid into cgroup.procs in each of them.
func (g *Group) Dirs() []string { return g.h.d.dirs(g.rel) }

// Exists reports whether any of g's directories exists.
func (g *Group) Exists() bool {
	for _, d := range g.Dirs() {
		if _, err := os.Stat(d); err == nil {
			return true
		}
	}
	return false
}

// OOMKills is how many processes of g the OOM killer has killed since g
// was created (ErrNoOOMCount when the kernel does not say).
func (g *Group) OOMKills() (uint64, error) { return g.h.d.oomKills(g.rel) }

// CPUUsage is the CPU time g's processes have used.
func (g *Group) CPUUsage() (time.Duration, error) { return g.h.d.cpuUsage(g.rel) }

// Pids lists the processes in g and below it.
func (g *Group) Pids() ([]int, error) {
	seen := map[int]bool{}
	var errs []error
	for _, root := range g.Dirs() {
		err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil // removed meanwhile
				}
				return err
			}
			if !e.IsDir() {
				return nil
			}
			data, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENODEV) {
					return nil
				}
				return err
			}
			for _, f := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil {
					seen[pid] = true
				}
			}
			return nil
		})
		errs = append(errs, err)
	}
	pids := make([]int, 0, len(seen))
	for pid := range seen {
		pids = append(pids, pid)
	}
	sort.Ints(pids)
	return pids, errors.Join(errs...)
}

// Kill sends SIGKILL to every process in g and below it.
func (g *Group) Kill() error {
	pids, err := g.Pids()
	for _, pid := range pids {
		if kerr := syscall.Kill(pid, syscall.SIGKILL); kerr != nil && !errors.Is(kerr, syscall.ESRCH) {
			err = errors.Join(err, fmt.Errorf("kill %d: %w", pid, kerr))
		}
	}
	return err
}

// removeRetry is how often Remove tries again while killed processes are
// still exiting.
const removeRetry = 20 * time.Millisecond

// Remove kills every process in g and below it and removes the cgroups,
// deepest first, in every hierarchy. Killed processes leave their cgroup
// once they have exited: Remove tries again every removeRetry until ctx
// ends. Removing what is already gone is no error.
func (g *Group) Remove(ctx context.Context) error {
	if g.rel == "" {
		return errors.New("refusing to remove the agent's own cgroup")
	}
	t := time.NewTicker(removeRetry)
	defer t.Stop()
	for {
		killErr := g.Kill()
		err := g.rmdirAll()
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) {
			return errors.Join(killErr, err)
		}
		select {
		case <-ctx.Done():
			pids, _ := g.Pids()
			return fmt.Errorf("cgroup %s: processes %v still there: %w", g.rel, pids, errors.Join(killErr, err))
		case <-t.C:
		}
	}
}

// rmdirAll removes g's directories and those below them, deepest first.
func (g *Group) rmdirAll() error {
	var errs []error
	for _, root := range g.Dirs() {
		var dirs []string
		err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			if e.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, d := range dirs {
			// A cgroup's control files cannot be unlinked: rmdir only.
			if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("rmdir %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}

// writeFile writes a control file's value (no O_CREATE: control files exist).
func writeFile(dir, name, value string) error {
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %q to %s: %w", value, filepath.Join(dir, name), err)
	}
	return nil
}

// readKey reads the value of a "key value" line of a flat-keyed control
// file (memory.oom_control, memory.events, cpu.stat).
func readKey(file, key string) (uint64, bool, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return 0, false, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(line, " ")
		if ok && k == key {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			return n, err == nil, err
		}
	}
	return 0, false, nil
}

// mkdir creates a cgroup directory; one that exists is fine.
func mkdir(dir string) error {
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return nil
}

// writable reports whether the process may create cgroups in dir.
func writable(dir string) error {
	const wOK = 2 // W_OK
	if err := syscall.Access(dir, wOK); err != nil {
		return fmt.Errorf("%s is not writable: %w", dir, err)
	}
	return nil
}
