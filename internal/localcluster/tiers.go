package localcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/redis/go-redis/v9"
	"github.com/ziptrail/ziptrail/internal/tools/paths"
)

// Credentials and bucket of the local slow tier. The server only listens on
// the pod network's bridge address, so fixed credentials are acceptable.
const (
	s3AccessKey = "ziptrail-local"
	s3SecretKey = "ziptrail-local-secret"
	s3Bucket    = "ziptrail"
)

// tierServers are the storage tiers of the local cluster: redis-server (the
// fast tier and the engine's checkpoints) and MinIO (the slow tier, where
// sidecars back up unread objects on SIGTERM). Each is started when its
// binary is installed; both listen on the bridge address so that pods and
// the host reach them.
type tierServers struct {
	redisAddr, s3Endpoint string
	redis                 *redis.Client
	procs                 []*exec.Cmd
}

// startTiers starts the installed tier servers on host (the bridge address).
// A missing binary leaves that tier off; a binary that fails to start is an
// error.
func startTiers(ctx context.Context, stateDir, host string, step func(string, ...any)) (*tierServers, error) {
	t := &tierServers{}
	killLeftovers(stateDir)
	if bin := paths.FindBinary("redis-server"); bin != "" {
		port, err := freePort(host)
		if err != nil {
			return t, err
		}
		dir := filepath.Join(stateDir, "redis")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return t, err
		}
		t.redisAddr = net.JoinHostPort(host, strconv.Itoa(port))
		// Protected mode refuses non-loopback clients without a password;
		// the bridge address is reachable from this host and its pods only.
		if err := t.start(stateDir, "redis", exec.Command(bin, "--bind", host, "--port", strconv.Itoa(port), "--protected-mode", "no",
			"--save", "", "--appendonly", "no", "--dir", dir)); err != nil {
			return t, err
		}
		t.redis = redis.NewClient(&redis.Options{Addr: t.redisAddr})
		if err := waitFor(ctx, "redis-server", func() bool { return t.redis.Ping(ctx).Err() == nil }); err != nil {
			return t, withLog(err, stateDir, "redis")
		}
		step("redis-server on %s (fast tier, engine checkpoints)", t.redisAddr)
	} else {
		step("redis-server not installed: no fast tier, no engine checkpoints")
	}
	if bin := paths.FindBinary("minio"); bin != "" {
		port, err := freePort(host)
		if err != nil {
			return t, err
		}
		console, err := freePort(host)
		if err != nil {
			return t, err
		}
		t.s3Endpoint = net.JoinHostPort(host, strconv.Itoa(port))
		dir := filepath.Join(stateDir, "minio")
		_ = os.RemoveAll(dir) // objects of an earlier run are garbage
		cmd := exec.Command(bin, "server", "--quiet", "--address", t.s3Endpoint,
			"--console-address", net.JoinHostPort(host, strconv.Itoa(console)), dir)
		cmd.Env = append(os.Environ(), "MINIO_ROOT_USER="+s3AccessKey, "MINIO_ROOT_PASSWORD="+s3SecretKey, "MINIO_BROWSER=off")
		if err := t.start(stateDir, "minio", cmd); err != nil {
			return t, err
		}
		if err := waitFor(ctx, "minio", func() bool {
			resp, err := http.Get("http://" + t.s3Endpoint + "/minio/health/live")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		}); err != nil {
			return t, withLog(err, stateDir, "minio")
		}
		mc, err := minio.New(t.s3Endpoint, &minio.Options{Creds: credentials.NewStaticV4(s3AccessKey, s3SecretKey, "")})
		if err != nil {
			return t, err
		}
		if err := mc.MakeBucket(ctx, s3Bucket, minio.MakeBucketOptions{}); err != nil {
			return t, fmt.Errorf("minio: create bucket %s: %w", s3Bucket, err)
		}
		step("MinIO on %s (slow tier: SIGTERM backups)", t.s3Endpoint)
	} else {
		step("minio not installed (hack/install-deps.sh builds it): no slow tier")
	}
	return t, nil
}

// start runs a server in its own process group, logging to the state dir,
// and records its pid so that the next start can remove it after a crash.
func (t *tierServers) start(stateDir, name string, cmd *exec.Cmd) error {
	log, err := os.Create(filepath.Join(stateDir, name+".log"))
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("start %s: %w", name, err)
	}
	log.Close() // the child holds its own descriptor
	t.procs = append(t.procs, cmd)
	return os.WriteFile(filepath.Join(stateDir, name+".pid"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644)
}

// stop kills the servers (they hold nothing worth keeping) and reaps them.
func (t *tierServers) stop(stateDir string) {
	if t.redis != nil {
		_ = t.redis.Close()
	}
	for _, cmd := range t.procs {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	}
	for _, name := range []string{"redis", "minio"} {
		_ = os.Remove(filepath.Join(stateDir, name+".pid"))
	}
}

// KillLeftovers stops the tier servers a crashed run with stateDir left
// behind and removes its state file. Servers are identified by their pid
// files and checked against the process's command line, so that a reused
// pid is never killed.
func KillLeftovers(stateDir string) {
	_ = os.Remove(StateFile(stateDir))
	killLeftovers(stateDir)
}

func killLeftovers(stateDir string) {
	for _, name := range []string{"redis", "minio"} {
		pidFile := filepath.Join(stateDir, name+".pid")
		data, err := os.ReadFile(pidFile)
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
		cmdline, rerr := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err == nil && rerr == nil && strings.Contains(string(cmdline), name) {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
		}
		_ = os.Remove(pidFile)
	}
}

func freePort(host string) (int, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// withLog adds the end of a server's log to its error.
func withLog(err error, stateDir, name string) error {
	data, _ := os.ReadFile(filepath.Join(stateDir, name+".log"))
	if len(data) > 2000 {
		data = data[len(data)-2000:]
	}
	return fmt.Errorf("%w:\n%s", err, data)
}

// waitFor polls ready for a server that just started (at most 30 s).
func waitFor(ctx context.Context, what string, ready func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for !ready() {
		select {
		case <-ctx.Done():
			return errors.New(what + " did not become ready")
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}
