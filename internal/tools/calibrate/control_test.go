package calibrate

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ziptrail/ziptrail/internal/operator/orchestrator"
	"github.com/ziptrail/ziptrail/internal/shuffle/model"
)

// pythonSDK is the Python of the repository's test environment
// (hack/install-deps.sh's venv, else python3 on $PATH) with the working
// tree's sdk/python first on its path for every process the test starts
// (PYTHONPATH), so the test measures these sources. It fails, not skips,
// when that python cannot import the SDK.
func pythonSDK(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(os.Getenv("ZIPTRAIL_CACHE"), "venv", "bin", "python3")
	if os.Getenv("ZIPTRAIL_CACHE") == "" {
		home, _ := os.UserHomeDir()
		bin = filepath.Join(home, ".cache", "ziptrail", "venv", "bin", "python3")
	}
	if _, err := os.Stat(bin); err != nil {
		if bin, err = exec.LookPath("python3"); err != nil {
			t.Fatal("no python3: run `eval \"$(hack/install-deps.sh --env)\"` (make test does)")
		}
	}
	sdk, err := filepath.Abs(filepath.Join("..", "..", "..", "sdk", "python"))
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("PYTHONPATH", sdk)
	t.Setenv("PYTHONDONTWRITEBYTECODE", "1")
	if err := pythonWithSDK(bin); err != nil {
		t.Fatalf("%s cannot import the ziptrail SDK from %s (its dependencies: pip install %s): %v", bin, sdk, sdk, err)
	}
	return bin
}

// checkPythonAndControl checks TestSidecarPathCPU's Python and
// control-path measurements and their fit: every store and direction
// through the sidecars with the Python SDK's process's CPU; every control
// session with its objects and invocations counted and the engine's,
// sidecars' and functions' CPU read; the fit's ControlCPU and SDKCPU.
func checkPythonAndControl(t *testing.T, m *Measurements, p model.Params, notes []string) {
	t.Helper()
	sizes := sidecarSizes(1 * model.MB)
	if want := 3*2*len(sizes) + 2*len(sizes); len(m.PythonSDK) != want {
		t.Fatalf("%d Python SDK samples, want %d", len(m.PythonSDK), want)
	}
	var pyCPU float64
	for _, s := range m.PythonSDK {
		pyCPU += s.ClientCPU
		if s.Requests < 1 || s.Bytes != float64(s.Requests)*s.Size || !(s.Seconds > 0) || s.SidecarCPU < 0 || !(s.ClientCPU > 0) {
			t.Errorf("python sample %+v", s)
		}
	}
	if !(pyCPU > 0.05) {
		t.Errorf("the Python SDK's CPU over every point: %.3f s", pyCPU)
	}
	points := controlPoints(true)
	if len(m.Control) != len(points) {
		t.Fatalf("%d control sessions, want %d", len(m.Control), len(points))
	}
	if m.CheckpointMaxShare != orchestrator.DefaultCheckpointMaxShare {
		t.Errorf("recorded checkpoint share %v, want the orchestrator's default %v", m.CheckpointMaxShare, orchestrator.DefaultCheckpointMaxShare)
	}
	for i, s := range m.Control {
		cp := points[i]
		ticks := holdTicks(cp.Hold)
		if s.ControlPoint != cp || s.Objects != cp.Maps*cp.ObjectsPerMap+cp.Groups+1+ticks || s.Sends != cp.Maps*cp.ObjectsPerMap+ticks ||
			s.Invocations != cp.Maps+cp.Groups+2 || !(s.Seconds > 0) {
			t.Errorf("control session %d: %+v", i, s)
		}
		if !(s.EngineCPU+s.SidecarCPU > 0) || !(s.FunctionCPU > 0) || s.StoreCPU < 0 {
			t.Errorf("control session %d: CPU engine %v, sidecars %v, redis %v, functions %v", i, s.EngineCPU, s.SidecarCPU, s.StoreCPU, s.FunctionCPU)
		}
	}
	if p.ControlCPU == (model.ControlCPU{}) {
		t.Errorf("no control-path CPU fitted:\n%s", strings.Join(notes, "\n"))
	}
	py, ok := p.SDKCPU["python"]
	if !ok || py.Slow.Write == (model.CPUCost{}) || py.Pod.Read == (model.CPUCost{}) || (py.Send == (model.CPUCost{}) && py.PerInvocation == 0) {
		t.Errorf("python SDK CPU %+v", py)
	}
	// the whole path with the Python SDK as the client, every store and
	// direction, costing at least the SDK's own share
	for name, c := range map[string][2]model.CPUCost{
		"s3 write": {py.Path.Slow.Write, py.Slow.Write}, "s3 read": {py.Path.Slow.Read, py.Slow.Read},
		"redis write": {py.Path.Fast.Write, py.Fast.Write}, "redis read": {py.Path.Fast.Read, py.Fast.Read},
		"pod put": {py.Path.Pod.Write, py.Pod.Write}, "pod get": {py.Path.Pod.Read, py.Pod.Read},
	} {
		path, own := c[0], c[1]
		if path == (model.CPUCost{}) || path.Of(1<<20, 1) < own.Of(1<<20, 1) {
			t.Errorf("python SDK path %s: %+v (its own share %+v)", name, path, own)
		}
	}
	if _, ok := p.SDKCPU["go"]; !ok {
		t.Errorf("no Go SDK CPU fitted: %+v", p.SDKCPU)
	}
	if p.SDKCPU["go"].Path != (model.PathCPU{}) {
		t.Errorf("a Go path besides SlowCPU, FastCPU and PodCPU: %+v", p.SDKCPU["go"].Path)
	}
}
