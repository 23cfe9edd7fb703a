package calibrate

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ziptrail/ziptrail/internal/shuffle/model"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// TestSidecarPathCPU runs the sidecar-path points against two real
// queue-proxy-zl processes (built from ./cmd/queue-proxy-zl), a real
// redis-server and MinIO: every store and direction is measured through
// the sidecars, their CPU is read, and the fit prices the platform's CPU
// from these points — the pod-memory write (a producer's put into its
// own sidecar) and the tiers' deletes included, which the in-process
// measurements cannot see. The same run measures the Python SDK's side
// (a real Python process with the working tree's SDK) and the control
// path (a real engine, the sidecars connected to it, Python functions):
// checkPythonAndControl.
func TestSidecarPathCPU(t *testing.T) {
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin, "./cmd/queue-proxy-zl")
	build.Dir = filepath.Join("..", "..", "..")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/queue-proxy-zl: %v\n%s", err, out)
	}
	rs := servers.StartRedis(t)
	mi := servers.StartMinIO(t)
	bucket := mi.Bucket(t, "calibrate")
	pids := map[string]int{}
	for store, addr := range map[string]string{Redis: rs.Addr, S3: mi.Endpoint} {
		pid, err := ListenerPID(addr)
		if err != nil {
			t.Fatal(err)
		}
		pids[store] = pid
	}
	py := pythonSDK(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	m, err := Measure(ctx, Config{
		ServerPIDs:       pids,
		Redis:            &redis.Options{Addr: rs.Addr},
		S3:               S3Endpoint{Endpoint: mi.Endpoint, AccessKey: mi.AccessKey, SecretKey: mi.SecretKey, Bucket: bucket},
		DurationPerPoint: 200 * time.Millisecond,
		MaxObject:        1 * model.MB,
		Workers:          []int{1},
		Sidecar:          &SidecarPath{Binary: filepath.Join(bin, "queue-proxy-zl"), Python: py},
		Progress:         &progress,
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	t.Log("\n" + progress.String())

	sizes := sidecarSizes(1 * model.MB)
	if len(sizes) != 2 {
		t.Fatalf("sidecar sizes up to 1 MB: %v", sizes)
	}
	// every store and direction at every size, and the tiers' deletes
	if want := 3*2*len(sizes) + 2*len(sizes); len(m.SidecarPath) != want {
		t.Fatalf("%d sidecar-path samples, want %d", len(m.SidecarPath), want)
	}
	seen := map[string]bool{}
	var sidecarCPU float64
	for _, s := range m.SidecarPath {
		seen[s.Store+" "+s.Op] = true
		sidecarCPU += s.SidecarCPU
		if s.Requests < 1 || s.Bytes != float64(s.Requests)*s.Size || !(s.Seconds > 0) || s.SidecarCPU < 0 || s.ClientCPU < 0 {
			t.Errorf("sample %+v", s)
		}
		if (s.Store == Pod) != (s.ServerCPU < 0) {
			t.Errorf("%s %s: server CPU %v (measured for s3 and redis, none for pod memory)", s.Store, s.Op, s.ServerCPU)
		}
	}
	if len(seen) != 8 || !seen["s3 delete"] || !seen["redis delete"] || seen["pod delete"] {
		t.Errorf("stores and directions measured: %v", seen)
	}
	// /proc's times tick at 10 ms; a dozen points of 200 ms moving bytes
	// through the sidecars add up to far more
	if !(sidecarCPU > 0.05) {
		t.Errorf("the sidecars' CPU over every point: %.3f s", sidecarCPU)
	}

	p, notes, err := Fit(m, model.DefaultParams())
	if err != nil {
		t.Fatal(err)
	}
	// (a Redis delete costs ~0.1 ms: in points this short it may stay
	// under the 50 ms a sample needs, and then it is not measured)
	if p.PodCPU.Write == (model.CPUCost{}) || p.SlowCPU.Write == (model.CPUCost{}) || p.FastCPU.Read == (model.CPUCost{}) ||
		p.SlowCPU.Delete == (model.CPUCost{}) {
		t.Errorf("platform CPU slow %+v fast %+v pod %+v", p.SlowCPU, p.FastCPU, p.PodCPU)
	}
	checkPythonAndControl(t, m, p, notes)
	via := 0
	for _, n := range notes {
		if strings.Contains(n, "CPU:") && strings.Contains(n, "through queue-proxy-zl") ||
			strings.HasPrefix(n, "redis delete CPU: no CPU samples of at least 50 ms") {
			via++
		}
	}
	if via != 8 {
		t.Errorf("%d CPU notes say they were fitted on the sidecar path, want 8:\n%s", via, strings.Join(notes, "\n"))
	}
}
