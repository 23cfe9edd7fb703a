// Package sandbox runs a container's process inside its pod's sandbox: the
// pod's network namespace (entered with `ip netns exec`, which also gives the
// process a private mount namespace) plus the bind mounts a kubelet gives a
// container — its volumes at their mountPaths, the pod's /dev/shm,
// /etc/hosts and /etc/resolv.conf. The mounts are made by a small re-exec of
// the agent's own binary (the hidden InitCommand) which first joins the
// container's cgroups (Spec.Cgroups) and then execs the container's
// command, so the agent itself never changes namespaces (setns and Go's
// threads do not mix).
package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// InitCommand is the hidden first argument that turns the agent binary into
// the in-sandbox init: `<agent> __ziptrail-container-init <spec.json> [-- argv...]`.
const InitCommand = "__ziptrail-container-init"

// Mount is one bind mount inside the container.
type Mount struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

// Spec is what the init needs to start a container's process.
type Spec struct {
	Argv       []string `json:"argv"`
	Env        []string `json:"env"`
	WorkingDir string   `json:"workingDir"`
	Mounts     []Mount  `json:"mounts"`
	// Hostname, when set, is the container's host name (own UTS namespace).
	Hostname string `json:"hostname,omitempty"`
	// CreatedLog is a file the init appends every mount point it had to
	// create on the host's filesystem to, so the agent can remove them.
	CreatedLog string `json:"createdLog,omitempty"`
	// Cgroups are the container's cgroup directories, one per hierarchy.
	// The init joins them before anything else, so the command runs
	// within the container's limits from its first instruction. It cannot
	// open them itself (`ip netns exec` mounts a fresh /sys, without
	// /sys/fs/cgroup): Start and Exec pass each one's cgroup.procs, open,
	// as file descriptors 3, 4… and their number in $ZIPTRAIL_CGROUP_FDS.
	Cgroups []string `json:"cgroups,omitempty"`
}

// cgroupFDsEnv names the number of cgroup.procs files passed to the init.
const cgroupFDsEnv = "ZIPTRAIL_CGROUP_FDS"

// MaybeRunInit runs the in-sandbox init and never returns when the process
// was started as one; otherwise it returns at once. Call it first in main
// (and in TestMain of tests that run containers).
func MaybeRunInit() {
	if len(os.Args) < 3 || os.Args[1] != InitCommand {
		return
	}
	err := runInit(os.Args[2], os.Args[3:])
	fmt.Fprintf(os.Stderr, "ziptrail-node: container init: %v\n", err)
	os.Exit(128)
}

func runInit(specPath string, override []string) error {
	data, err := os.ReadFile(specPath)
	if err != nil {
		return err
	}
	var s Spec
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("parse %s: %w", specPath, err)
	}
	if len(override) > 0 && override[0] == "--" {
		s.Argv = override[1:] // exec probes and `kubectl exec`: same mounts, env and directory
	}
	if len(s.Argv) == 0 {
		return fmt.Errorf("no command to run")
	}
	if err := joinCgroups(s.Cgroups); err != nil {
		return err
	}
	// Namespaces created here belong to this thread; exec from it.
	runtime.LockOSThread()
	if s.Hostname != "" {
		if err := syscall.Unshare(syscall.CLONE_NEWUTS); err != nil {
			return fmt.Errorf("new UTS namespace: %w", err)
		}
		if err := syscall.Sethostname([]byte(s.Hostname)); err != nil {
			return fmt.Errorf("set hostname: %w", err)
		}
	}
	// Parents first, so a mount point inside another volume is created in
	// that volume's directory.
	sort.SliceStable(s.Mounts, func(i, j int) bool {
		return strings.Count(filepath.Clean(s.Mounts[i].Target), "/") < strings.Count(filepath.Clean(s.Mounts[j].Target), "/")
	})
	for _, m := range s.Mounts {
		if err := ensureMountPoint(m, s.CreatedLog); err != nil {
			return err
		}
		if err := bind(m); err != nil {
			return err
		}
	}
	dir := s.WorkingDir
	if dir == "" {
		dir = "/"
	}
	if err := os.Chdir(dir); err != nil {
		return fmt.Errorf("working directory: %w", err)
	}
	argv0, err := lookPath(s.Argv[0], s.Env)
	if err != nil {
		return err
	}
	return syscall.Exec(argv0, s.Argv, s.Env)
}

// joinCgroups moves the process into the container's cgroups by writing
// its pid into the cgroup.procs files the agent passed (file descriptors
// from 3 on), then closes them so the command does not inherit them.
func joinCgroups(dirs []string) error {
	n, _ := strconv.Atoi(os.Getenv(cgroupFDsEnv))
	pid := strconv.Itoa(os.Getpid())
	var errs []error
	for i := range n {
		f := os.NewFile(uintptr(3+i), "cgroup.procs")
		if _, err := f.WriteString(pid); err != nil {
			where := fmt.Sprintf("file descriptor %d", 3+i)
			if len(dirs) == n {
				where = dirs[i]
			}
			errs = append(errs, fmt.Errorf("join cgroup %s: %w", where, err))
		}
		f.Close()
	}
	return errors.Join(errs...)
}

// ensureMountPoint creates a missing target (a directory, or an empty file
// when the source is a file) and logs every path it created.
func ensureMountPoint(m Mount, logPath string) error {
	if _, err := os.Lstat(m.Target); err == nil {
		return nil
	}
	src, err := os.Stat(m.Source)
	if err != nil {
		return fmt.Errorf("volume source %s: %w", m.Source, err)
	}
	var created []string
	dir := m.Target
	if !src.IsDir() {
		dir = filepath.Dir(m.Target)
	}
	for d := dir; d != "/" && d != "."; d = filepath.Dir(d) {
		if _, err := os.Lstat(d); err == nil {
			break
		}
		created = append(created, d)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create mount point %s: %w", m.Target, err)
	}
	if !src.IsDir() {
		f, err := os.OpenFile(m.Target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			return fmt.Errorf("create mount point %s: %w", m.Target, err)
		}
		f.Close()
		created = append([]string{m.Target}, created...)
	}
	if logPath == "" || len(created) == 0 {
		return nil
	}
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.WriteString(strings.Join(created, "\n") + "\n") // deepest first
	return err
}

func bind(m Mount) error {
	if err := syscall.Mount(m.Source, m.Target, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
		return fmt.Errorf("bind-mount %s on %s: %w", m.Source, m.Target, err)
	}
	if m.ReadOnly {
		if err := syscall.Mount("", m.Target, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY|syscall.MS_REC, ""); err != nil {
			return fmt.Errorf("remount %s read-only: %w", m.Target, err)
		}
	}
	return nil
}

// lookPath resolves a command name with the container's PATH, as a runtime does.
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("executable %q not found in the container's PATH (%s): %w", name, path, exec.ErrNotFound)
}
