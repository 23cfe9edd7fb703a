package cgroups

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// v1Controllers are the v1 controllers the agent uses: memory and cpu for
// the limits, cpuacct for the CPU usage (when it is not co-mounted with
// cpu it is a hierarchy of its own).
var v1Controllers = []string{"memory", "cpu", "cpuacct"}

// v1Hierarchy is one mounted v1 hierarchy the agent uses.
type v1Hierarchy struct {
	controllers []string // of v1Controllers, those it carries
	own         string   // the agent's own cgroup in it
}

// v1 is the cgroup v1 layout: one directory tree per hierarchy.
type v1 struct {
	hierarchies []v1Hierarchy
}

func newV1(mounts []mount, own procCgroup) (*v1, error) {
	d := &v1{}
	var errs []error
	for _, c := range v1Controllers {
		dir, err := findV1(mounts, own, c)
		if err == nil {
			err = writable(dir)
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		i := slices.IndexFunc(d.hierarchies, func(h v1Hierarchy) bool { return h.own == dir })
		if i < 0 { // co-mounted controllers (cpu,cpuacct) share one tree
			d.hierarchies = append(d.hierarchies, v1Hierarchy{own: dir})
			i = len(d.hierarchies) - 1
		}
		d.hierarchies[i].controllers = append(d.hierarchies[i].controllers, c)
	}
	if d.dir("memory", "") == "" && d.dir("cpu", "") == "" {
		return nil, fmt.Errorf("neither the memory nor the cpu controller is usable: %w", errors.Join(errs...))
	}
	return d, nil
}

func (d *v1) version() int { return 1 }

func (d *v1) controllers() []string {
	var out []string
	for _, h := range d.hierarchies {
		out = append(out, h.controllers...)
	}
	return out
}

func (d *v1) dirs(rel string) []string {
	out := make([]string, len(d.hierarchies))
	for i, h := range d.hierarchies {
		out[i] = join(h.own, rel)
	}
	return out
}

// dir is rel's directory in controller c's hierarchy ("" when the agent
// does not use c).
func (d *v1) dir(c, rel string) string {
	for _, h := range d.hierarchies {
		if slices.Contains(h.controllers, c) {
			return join(h.own, rel)
		}
	}
	return ""
}

func (d *v1) create(rel string, l Limits) error {
	for _, h := range d.hierarchies {
		if err := mkdir(join(h.own, rel)); err != nil {
			return err
		}
	}
	if dir := d.dir("memory", rel); dir != "" && l.MemoryBytes > 0 {
		v := strconv.FormatInt(l.MemoryBytes, 10)
		if err := writeFile(dir, "memory.limit_in_bytes", v); err != nil {
			return err
		}
		// No swap on top of the limit (memsw counts memory plus swap).
		// Best effort: the file is absent when the kernel does not
		// account swap, and without swap it changes nothing.
		_ = writeFile(dir, "memory.memsw.limit_in_bytes", v)
	}
	if dir := d.dir("cpu", rel); dir != "" {
		if l.CPUQuotaMicros > 0 {
			if err := writeFile(dir, "cpu.cfs_period_us", strconv.Itoa(CPUPeriodMicros)); err != nil {
				return err
			}
			if err := writeFile(dir, "cpu.cfs_quota_us", strconv.FormatInt(l.CPUQuotaMicros, 10)); err != nil {
				return err
			}
		}
		if l.CPUShares > 0 {
			if err := writeFile(dir, "cpu.shares", strconv.FormatUint(l.CPUShares, 10)); err != nil {
				return err
			}
		}
	}
	return nil
}

// oomKills reads the oom_kill line of memory.oom_control (kernel ≥ 4.13).
// The kernel counts a kill before it sends the SIGKILL, so the count is
// current once the victim has been reaped.
func (d *v1) oomKills(rel string) (uint64, error) {
	dir := d.dir("memory", rel)
	if dir == "" {
		return 0, errors.New("the memory controller is not in use")
	}
	n, ok, err := readKey(filepath.Join(dir, "memory.oom_control"), "oom_kill")
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, ErrNoOOMCount
	}
	return n, nil
}

func (d *v1) cpuUsage(rel string) (time.Duration, error) {
	dir := d.dir("cpuacct", rel)
	if dir == "" {
		return 0, errors.New("the cpuacct controller is not in use")
	}
	data, err := os.ReadFile(filepath.Join(dir, "cpuacct.usage"))
	if err != nil {
		return 0, err
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	return time.Duration(ns), err
}
