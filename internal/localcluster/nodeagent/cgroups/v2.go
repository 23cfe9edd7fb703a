package cgroups

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// v2Controllers are the v2 controllers the agent uses.
var v2Controllers = []string{"memory", "cpu"}

// agentLeaf is the cgroup the agent moves itself into on v2 when its own
// cgroup holds processes: controllers are enabled for a cgroup's children
// only while it has no processes of its own ("no internal processes"),
// and a delegated cgroup (systemd's Delegate=yes) starts with the agent in
// it.
const agentLeaf = "ziptrail-nodeagent-agent"

// v2 is the unified layout: one tree, controllers enabled per level
// through cgroup.subtree_control.
type v2 struct {
	own   string
	ctrls []string
}

func newV2(mounts []mount, own procCgroup) (*v2, error) {
	dir, err := findV2(mounts, own)
	if err != nil {
		return nil, err
	}
	if filepath.Base(dir) == agentLeaf {
		dir = filepath.Dir(dir) // an earlier Detect moved the agent there
	}
	if err := writable(dir); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return nil, err
	}
	available := strings.Fields(string(data))
	d := &v2{own: dir}
	for _, c := range v2Controllers {
		if slices.Contains(available, c) {
			d.ctrls = append(d.ctrls, c)
		}
	}
	if len(d.ctrls) == 0 {
		return nil, fmt.Errorf("%s offers neither the memory nor the cpu controller (cgroup.controllers: %q)", dir, strings.TrimSpace(string(data)))
	}
	err = d.enable(dir)
	if errors.Is(err, syscall.EBUSY) {
		leaf := filepath.Join(dir, agentLeaf)
		if err := mkdir(leaf); err != nil {
			return nil, err
		}
		if err := writeFile(leaf, "cgroup.procs", strconv.Itoa(os.Getpid())); err != nil {
			return nil, err
		}
		if err = d.enable(dir); err != nil {
			return nil, fmt.Errorf("%w (other processes share the agent's cgroup %s: delegate a cgroup to the agent alone)", err, dir)
		}
	}
	if err != nil {
		return nil, err
	}
	return d, nil
}

// enable turns the agent's controllers on for dir's children.
func (d *v2) enable(dir string) error {
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	if err != nil {
		return err
	}
	on := strings.Fields(string(data))
	var add []string
	for _, c := range d.ctrls {
		if !slices.Contains(on, c) {
			add = append(add, "+"+c)
		}
	}
	if len(add) == 0 {
		return nil
	}
	return writeFile(dir, "cgroup.subtree_control", strings.Join(add, " "))
}

func (d *v2) version() int          { return 2 }
func (d *v2) controllers() []string { return slices.Clone(d.ctrls) }

func (d *v2) dirs(rel string) []string { return []string{join(d.own, rel)} }

func (d *v2) create(rel string, l Limits) error {
	if parent := path.Dir(rel); parent != "." && parent != "/" {
		if err := d.enable(join(d.own, parent)); err != nil {
			return err
		}
	}
	dir := join(d.own, rel)
	if err := mkdir(dir); err != nil {
		return err
	}
	if slices.Contains(d.ctrls, "memory") && l.MemoryBytes > 0 {
		if err := writeFile(dir, "memory.max", strconv.FormatInt(l.MemoryBytes, 10)); err != nil {
			return err
		}
		// No swap on top of the limit; best effort (absent without swap
		// accounting).
		_ = writeFile(dir, "memory.swap.max", "0")
	}
	if slices.Contains(d.ctrls, "cpu") {
		if l.CPUQuotaMicros > 0 {
			if err := writeFile(dir, "cpu.max", fmt.Sprintf("%d %d", l.CPUQuotaMicros, CPUPeriodMicros)); err != nil {
				return err
			}
		}
		if l.CPUShares > 0 {
			if err := writeFile(dir, "cpu.weight", strconv.FormatUint(SharesToWeight(l.CPUShares), 10)); err != nil {
				return err
			}
		}
	}
	return nil
}

// SharesToWeight converts v1 cpu.shares (2–262144) to v2 cpu.weight
// (1–10000) as the kubelet and runc do.
func SharesToWeight(shares uint64) uint64 {
	shares = min(max(shares, 2), 262144)
	return 1 + ((shares-2)*9999)/262142
}

// oomKills reads memory.events: oom_kill counts the kills of the cgroup's
// processes (and its descendants'); the kernel counts a kill before it
// sends the SIGKILL.
func (d *v2) oomKills(rel string) (uint64, error) {
	if !slices.Contains(d.ctrls, "memory") {
		return 0, errors.New("the memory controller is not in use")
	}
	n, ok, err := readKey(filepath.Join(join(d.own, rel), "memory.events"), "oom_kill")
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, ErrNoOOMCount
	}
	return n, nil
}

func (d *v2) cpuUsage(rel string) (time.Duration, error) {
	us, ok, err := readKey(filepath.Join(join(d.own, rel), "cpu.stat"), "usage_usec")
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, errors.New("cpu.stat has no usage_usec")
	}
	return time.Duration(us) * time.Microsecond, nil
}
