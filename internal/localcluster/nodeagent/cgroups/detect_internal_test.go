package cgroups

import (
	"os"
	"path/filepath"
	"testing"
)

// The process's own cgroup is found through the mount that shows it, on
// the layouts hosts have: v1 with separate and co-mounted hierarchies
// (a container's mounts show only its part of the tree), and v2.
func TestFindOwnDirs(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	mounts, err := readMountinfo(write("mountinfo", `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:9 - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 /docker/abc /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
38 31 0:35 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
40 23 0:36 / /mnt/with\040space rw - cgroup2 none rw
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(mounts) != 5 || mounts[4].point != "/mnt/with space" {
		t.Fatalf("mounts %+v", mounts)
	}
	own, err := readProcCgroup(write("cgroup", `5:memory:/docker/abc/sub
4:cpu,cpuacct:/user.slice
1:name=systemd:/user.slice/session-1.scope
0::/user.slice/session-1.scope
`))
	if err != nil {
		t.Fatal(err)
	}
	for c, want := range map[string]string{"memory": "/sys/fs/cgroup/memory/sub", "cpu": "/sys/fs/cgroup/cpu,cpuacct/user.slice",
		"cpuacct": "/sys/fs/cgroup/cpu,cpuacct/user.slice"} {
		if got, err := findV1(mounts, own, c); err != nil || got != want {
			t.Errorf("%s: %q, %v; want %q", c, got, err, want)
		}
	}
	if _, err := findV1(mounts, own, "pids"); err == nil {
		t.Error("pids found")
	}
	if got, err := findV2(mounts, own); err != nil || got != "/sys/fs/cgroup/unified/user.slice/session-1.scope" {
		t.Errorf("v2: %q, %v", got, err)
	}
	// A mount whose root is elsewhere in the hierarchy does not show the cgroup.
	own.v1["memory"] = "/other"
	if got, err := findV1(mounts, own, "memory"); err == nil {
		t.Errorf("memory found at %q outside the mount's root", got)
	}
	if got := join("/sys/fs/cgroup/memory", "ziptrail-nodeagent-n/podu/c"); got != "/sys/fs/cgroup/memory/ziptrail-nodeagent-n/podu/c" {
		t.Errorf("join %q", got)
	}
}
