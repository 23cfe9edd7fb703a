package sandbox

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"

	corev1 "k8s.io/api/core/v1"

	"github.com/ziptrail/ziptrail/internal/localcluster/netns"
)

// DNS is the cluster's DNS configuration written into each pod's resolv.conf.
type DNS struct {
	Server string // --cluster-dns
	Domain string // --cluster-domain, e.g. cluster.local
}

// Sandbox is one pod's network namespace and host directory
// (<pods dir>/<pod UID>): volumes, logs, container specs, /dev/shm, hosts and
// resolv.conf.
type Sandbox struct {
	Dir string
	Net *netns.Pod

	network *netns.Network
	mu      sync.Mutex
	targets []string                // mount targets registered as live
	cgroups map[string]*cgroupProcs // container -> its cgroup.procs files
	retired []*os.File              // replaced cgroup.procs files, closed by Destroy
}

// cgroupProcs are a container's cgroup.procs files, open for the life of
// the sandbox: its process and every exec (probes, kubectl exec) join the
// container's cgroups through them (Spec.Cgroups).
type cgroupProcs struct {
	dirs  []string
	files []*os.File
}

// Create makes the pod's sandbox: the directory, a /dev/shm tmpfs shared by
// its containers, the network namespace with its IP, /etc/hosts and
// /etc/resolv.conf.
func Create(ctx context.Context, network *netns.Network, podsDir string, pod *corev1.Pod, dns DNS) (_ *Sandbox, err error) {
	dir := filepath.Join(podsDir, string(pod.UID))
	s := &Sandbox{Dir: dir, network: network}
	defer func() {
		if err != nil {
			_ = s.Destroy(context.WithoutCancel(ctx))
		}
	}()
	for _, d := range []string{"shm", "etc", "containers", "logs", "volumes"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	if err := syscall.Mount("shm", filepath.Join(dir, "shm"), "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "mode=1777,size=64m"); err != nil {
		return nil, fmt.Errorf("mount the pod's /dev/shm: %w", err)
	}
	if s.Net, err = network.AddPod(ctx, string(pod.UID)); err != nil {
		return nil, err
	}
	// Hairpin: a pod reaching itself through a Service address.
	_, _ = exec.CommandContext(ctx, "ip", "link", "set", s.Net.HostVeth(), "type", "bridge_slave", "hairpin", "on").CombinedOutput()
	if err := os.WriteFile(filepath.Join(dir, "etc", "hosts"), []byte(hostsFile(pod, s.Net.IP.String())), 0o644); err != nil {
		return nil, err
	}
	resolv, err := resolvConf(pod, dns)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "etc", "resolv.conf"), []byte(resolv), 0o644); err != nil {
		return nil, err
	}
	return s, nil
}

// IP is the pod's address.
func (s *Sandbox) IP() string { return s.Net.IP.String() }

// LogPath is the log file of a container's run (restart count n).
func (s *Sandbox) LogPath(container string, n int32) string {
	return filepath.Join(s.Dir, "logs", container, fmt.Sprintf("%d.log", n))
}

// BaseMounts are the mounts every container of the pod gets.
func (s *Sandbox) BaseMounts() []Mount {
	return []Mount{
		{Source: filepath.Join(s.Dir, "shm"), Target: "/dev/shm"},
		{Source: filepath.Join(s.Dir, "etc", "hosts"), Target: "/etc/hosts"},
		{Source: filepath.Join(s.Dir, "etc", "resolv.conf"), Target: "/etc/resolv.conf"},
	}
}

func (s *Sandbox) specPath(container string) string {
	return filepath.Join(s.Dir, "containers", container+".json")
}

// Start launches a container's process in the sandbox, in its own process
// group, with stdout and stderr appended to logPath.
func (s *Sandbox) Start(container string, spec Spec, logPath string) (*exec.Cmd, error) {
	spec.CreatedLog = filepath.Join(s.Dir, "containers", container+".created")
	data, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	if err := writeAtomic(s.specPath(container), data, 0o600); err != nil {
		return nil, err
	}
	s.register(spec.Mounts)
	procs, err := s.cgroupFiles(container, spec.Cgroups)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return nil, err
	}
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	cmd, err := s.command(container, procs)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start container %s: %w", container, err)
	}
	return cmd, nil
}

// Exec returns a command that runs argv inside a started container's
// namespaces, mounts, environment and working directory (exec probes,
// `kubectl exec`).
func (s *Sandbox) Exec(container string, argv []string) (*exec.Cmd, error) {
	if _, err := os.Stat(s.specPath(container)); err != nil {
		return nil, fmt.Errorf("container %s has not been started", container)
	}
	s.mu.Lock()
	var procs []*os.File
	if p := s.cgroups[container]; p != nil {
		procs = p.files
	}
	s.mu.Unlock()
	cmd, err := s.command(container, procs, append([]string{"--"}, argv...)...)
	if err != nil {
		return nil, err
	}
	return cmd, nil
}

// command runs the init for a container; procs are the cgroup.procs files
// it joins (file descriptors 3, 4…).
func (s *Sandbox) command(container string, procs []*os.File, extra ...string) (*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := append([]string{"netns", "exec", s.Net.Name, self, InitCommand, s.specPath(container)}, extra...)
	cmd := exec.Command("ip", args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.ExtraFiles = procs
	cmd.Env = append(os.Environ(), cgroupFDsEnv+"="+strconv.Itoa(len(procs)))
	return cmd, nil
}

// cgroupFiles returns the container's cgroup.procs files for dirs, opening
// them the first time (and again when the directories change).
func (s *Sandbox) cgroupFiles(container string, dirs []string) ([]*os.File, error) {
	s.mu.Lock()
	cur := s.cgroups[container]
	s.mu.Unlock()
	if cur != nil && slices.Equal(cur.dirs, dirs) {
		return cur.files, nil
	}
	files := make([]*os.File, 0, len(dirs))
	for _, d := range dirs {
		f, err := os.OpenFile(filepath.Join(d, "cgroup.procs"), os.O_WRONLY, 0)
		if err != nil {
			for _, f := range files {
				f.Close()
			}
			return nil, fmt.Errorf("container %s: open its cgroup: %w", container, err)
		}
		files = append(files, f)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cgroups == nil {
		s.cgroups = map[string]*cgroupProcs{}
	}
	if old := s.cgroups[container]; old != nil {
		// An exec may be starting with them: closed with the sandbox.
		s.retired = append(s.retired, old.files...)
	}
	s.cgroups[container] = &cgroupProcs{dirs: slices.Clone(dirs), files: files}
	return files, nil
}

// closeCgroupFiles closes every cgroup.procs file of the sandbox.
func (s *Sandbox) closeCgroupFiles() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.cgroups {
		for _, f := range p.files {
			f.Close()
		}
	}
	for _, f := range s.retired {
		f.Close()
	}
	s.cgroups, s.retired = nil, nil
}

// Destroy removes the network namespace, unmounts everything under the
// sandbox's directory, removes the mount points its containers created on
// the host and finally the directory.
func (s *Sandbox) Destroy(ctx context.Context) error {
	var errs []error
	if s.Net != nil {
		errs = append(errs, s.network.DeletePod(ctx, s.Net))
	}
	s.unregister()
	s.closeCgroupFiles()
	errs = append(errs, UnmountUnder(s.Dir))
	logs, _ := filepath.Glob(filepath.Join(s.Dir, "containers", "*.created"))
	for _, l := range logs {
		addPending(l)
	}
	removePending()
	errs = append(errs, os.RemoveAll(s.Dir))
	return errors.Join(errs...)
}

// UnmountUnder detaches every mount at or below dir (deepest first).
func UnmountUnder(dir string) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		p := unescape(fields[4])
		if p == dir || strings.HasPrefix(p, dir+"/") {
			points = append(points, p)
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	var errs []error
	for _, p := range points {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

func unescape(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}

// Mount points created on the host's filesystem are shared by every pod that
// mounts at the same path; one is removed once no live sandbox mounts at or
// below it and it is empty.
var (
	liveMu  sync.Mutex
	live    = map[string]int{}
	pending = map[string]bool{}
)

func (s *Sandbox) register(mounts []Mount) {
	liveMu.Lock()
	defer liveMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range mounts {
		t := filepath.Clean(m.Target)
		s.targets = append(s.targets, t)
		live[t]++
	}
}

func (s *Sandbox) unregister() {
	liveMu.Lock()
	defer liveMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range s.targets {
		if live[t]--; live[t] <= 0 {
			delete(live, t)
		}
	}
	s.targets = nil
}

func addPending(createdLog string) {
	data, err := os.ReadFile(createdLog)
	if err != nil {
		return
	}
	liveMu.Lock()
	defer liveMu.Unlock()
	for _, p := range strings.Split(string(data), "\n") {
		if p != "" {
			pending[p] = true
		}
	}
}

// removePending removes the created mount points nobody uses any more,
// deepest first.
func removePending() {
	liveMu.Lock()
	defer liveMu.Unlock()
	paths := make([]string, 0, len(pending))
	for p := range pending {
		paths = append(paths, p)
	}
	sort.Slice(paths, func(i, j int) bool { return len(paths[i]) > len(paths[j]) })
	// Another agent on the host (a test suite next to `local up`) may
	// mount at the same path: removing a directory that is a mount point
	// in another mount namespace would detach that container's volume.
	elsewhere := mountedAnywhere(paths)
	var kept []string // still pending: their parents wait too
	for _, p := range paths {
		inUse := elsewhere[p]
		for _, k := range kept {
			if strings.HasPrefix(k, p+"/") {
				inUse = true
			}
		}
		for t := range live {
			if t == p || strings.HasPrefix(t, p+"/") {
				inUse = true
				break
			}
		}
		if inUse {
			kept = append(kept, p)
			continue
		}
		if removeIfEmpty(p) {
			delete(pending, p)
		} else {
			kept = append(kept, p)
		}
	}
}

// mountedAnywhere reports which of paths are mount points in any
// process's mount namespace on the host.
func mountedAnywhere(paths []string) map[string]bool {
	found := map[string]bool{}
	if len(paths) == 0 {
		return found
	}
	// Mount points are recorded with symlinks resolved (/var/run → /run).
	want := make(map[string]string, len(paths))
	for _, p := range paths {
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			real = p
		}
		want[real] = p
	}
	procs, _ := os.ReadDir("/proc")
	seen := map[string]bool{}
	for _, d := range procs {
		if d.Name()[0] < '0' || d.Name()[0] > '9' {
			continue
		}
		ns, err := os.Readlink("/proc/" + d.Name() + "/ns/mnt")
		if err != nil || seen[ns] {
			continue
		}
		seen[ns] = true
		f, err := os.Open("/proc/" + d.Name() + "/mountinfo")
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 5 {
				continue
			}
			if p, ok := want[unescape(fields[4])]; ok {
				found[p] = true
			}
		}
		f.Close()
	}
	return found
}

// removeIfEmpty removes an empty directory or empty regular file; it reports
// whether the path is gone.
func removeIfEmpty(p string) bool {
	fi, err := os.Lstat(p)
	if err != nil {
		return true
	}
	if fi.Mode().IsRegular() && fi.Size() != 0 {
		return true // written to since: no longer ours
	}
	if !fi.IsDir() && !fi.Mode().IsRegular() {
		return true
	}
	if err := os.Remove(p); err != nil {
		return fi.IsDir() && !isEmptyDir(p) // not empty: someone else's now
	}
	return true
}

func isEmptyDir(p string) bool {
	entries, err := os.ReadDir(p)
	return err == nil && len(entries) == 0
}

// CleanupDir removes what crashed runs left under a pods directory: mounts,
// the mount points their containers created, and the directories.
func CleanupDir(podsDir string) error {
	var errs []error
	errs = append(errs, UnmountUnder(podsDir))
	logs, _ := filepath.Glob(filepath.Join(podsDir, "*", "containers", "*.created"))
	for _, l := range logs {
		addPending(l)
	}
	removePending()
	errs = append(errs, os.RemoveAll(podsDir))
	return errors.Join(errs...)
}

// RemovePendingMountPoints retries removing created mount points (at shutdown).
func RemovePendingMountPoints() { removePending() }

func writeAtomic(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func hostsFile(pod *corev1.Pod, ip string) string {
	var b strings.Builder
	b.WriteString("# Kubernetes-managed hosts file (ziptrail-node).\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n")
	hostname := pod.Name
	if pod.Spec.Hostname != "" {
		hostname = pod.Spec.Hostname
	}
	if pod.Spec.Subdomain != "" {
		fmt.Fprintf(&b, "%s\t%s.%s.%s.svc\t%s\n", ip, hostname, pod.Spec.Subdomain, pod.Namespace, hostname)
	} else {
		fmt.Fprintf(&b, "%s\t%s\n", ip, hostname)
	}
	for _, a := range pod.Spec.HostAliases {
		fmt.Fprintf(&b, "# Entries added by HostAliases.\n%s\t%s\n", a.IP, strings.Join(a.Hostnames, "\t"))
	}
	return b.String()
}

func resolvConf(pod *corev1.Pod, dns DNS) (string, error) {
	var servers, searches, options []string
	switch pod.Spec.DNSPolicy {
	case corev1.DNSNone:
	case corev1.DNSDefault:
		host, err := os.ReadFile("/etc/resolv.conf")
		if err != nil {
			return "", err
		}
		for _, line := range strings.Split(string(host), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 {
				continue
			}
			switch f[0] {
			case "nameserver":
				servers = append(servers, f[1])
			case "search":
				searches = append(searches, f[1:]...)
			case "options":
				options = append(options, f[1:]...)
			}
		}
	default: // ClusterFirst, and ClusterFirstWithHostNet (no host network here)
		if dns.Server != "" {
			servers = []string{dns.Server}
		}
		searches = []string{pod.Namespace + ".svc." + dns.Domain, "svc." + dns.Domain, dns.Domain}
		options = []string{"ndots:5"}
	}
	if c := pod.Spec.DNSConfig; c != nil {
		servers = append(servers, c.Nameservers...)
		searches = append(searches, c.Searches...)
		for _, o := range c.Options {
			if o.Value != nil {
				options = append(options, o.Name+":"+*o.Value)
			} else {
				options = append(options, o.Name)
			}
		}
	}
	var b strings.Builder
	for _, s := range servers {
		fmt.Fprintf(&b, "nameserver %s\n", s)
	}
	if len(searches) > 0 {
		fmt.Fprintf(&b, "search %s\n", strings.Join(searches, " "))
	}
	if len(options) > 0 {
		fmt.Fprintf(&b, "options %s\n", strings.Join(options, " "))
	}
	return b.String(), nil
}
