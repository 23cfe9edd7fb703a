package cgroups

import (
	"bufio"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// mount is a cgroup file system mounted on the host (a line of
// /proc/self/mountinfo).
type mount struct {
	root       string          // the cgroup path mounted (usually /)
	point      string          // where
	fstype     string          // cgroup or cgroup2
	controller map[string]bool // v1: the hierarchy's controllers (super options)
}

// readMountinfo lists the cgroup and cgroup2 mounts.
func readMountinfo(file string) ([]mount, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var mounts []mount
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		// id parent major:minor root point options [optional...] - fstype source superoptions
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if sep < 5 || len(fields) < sep+4 {
			continue
		}
		fstype := fields[sep+1]
		if fstype != "cgroup" && fstype != "cgroup2" {
			continue
		}
		m := mount{root: unescape(fields[3]), point: unescape(fields[4]), fstype: fstype, controller: map[string]bool{}}
		for _, o := range strings.Split(fields[sep+3], ",") {
			m.controller[o] = true
		}
		mounts = append(mounts, m)
	}
	return mounts, sc.Err()
}

func unescape(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}

// procCgroup is the process's cgroups: v1 controller → path, and the v2
// path (the "0::" line).
type procCgroup struct {
	v1      map[string]string
	unified string
	hasV2   bool
}

func readProcCgroup(file string) (procCgroup, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return procCgroup{}, err
	}
	pc := procCgroup{v1: map[string]string{}}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			pc.unified, pc.hasV2 = parts[2], true
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			pc.v1[c] = parts[2]
		}
	}
	return pc, nil
}

// ownDir is where cgroup path p (as /proc/self/cgroup names it) is on the
// host, through mount m; false when m does not show it (the mount's root
// is elsewhere in the hierarchy).
func ownDir(m mount, p string) (string, bool) {
	rel, err := filepath.Rel(m.root, p)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", false
	}
	return filepath.Join(m.point, rel), true
}

// findV1 is the directory of the process's cgroup in the v1 hierarchy of
// controller c.
func findV1(mounts []mount, own procCgroup, c string) (string, error) {
	p, ok := own.v1[c]
	if !ok {
		return "", fmt.Errorf("the process has no %s cgroup", c)
	}
	for _, m := range mounts {
		if m.fstype != "cgroup" || !m.controller[c] {
			continue
		}
		if dir, ok := ownDir(m, p); ok {
			return dir, nil
		}
	}
	return "", fmt.Errorf("no mount of the %s hierarchy shows %s", c, p)
}

// findV2 is the directory of the process's cgroup in the unified hierarchy.
func findV2(mounts []mount, own procCgroup) (string, error) {
	if !own.hasV2 {
		return "", fmt.Errorf("the process has no cgroup v2 path")
	}
	for _, m := range mounts {
		if m.fstype != "cgroup2" {
			continue
		}
		if dir, ok := ownDir(m, own.unified); ok {
			return dir, nil
		}
	}
	return "", fmt.Errorf("no cgroup2 mount shows %s", own.unified)
}

func join(dir, rel string) string {
	if rel == "" {
		return dir
	}
	return filepath.Join(dir, filepath.FromSlash(path.Clean(rel)))
}
