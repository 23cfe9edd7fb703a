package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ziptrail/ziptrail/internal/shuffle/model"
	"github.com/ziptrail/ziptrail/internal/tools/calibrate"
	"github.com/ziptrail/ziptrail/internal/tools/envtest"
)

// TestCalibrateLocal runs `ziptrail calibrate --local --quick` against the
// redis-server and MinIO it starts, writing a file, the raw measurements
// and a ConfigMap on a real API server (envtest); the file loads back,
// equals the ConfigMap's calibration, and `explain --calibration` plans
// with it.
func TestCalibrateLocal(t *testing.T) {
	env, err := envtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	dir := t.TempDir()
	kubeconfig, err := env.Kubeconfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shuffle"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	file, raw := filepath.Join(dir, "cal.json"), filepath.Join(dir, "raw.json")
	var stdout, stderr bytes.Buffer
	// the sidecar path (real queue-proxy-zl processes) has its own test in
	// internal/tools/calibrate; here it is left out
	err = runCalibrate(ctx, []string{"--local", "--quick", "--duration-per-point", "100ms", "--worker-startup", "600ms", "--queue-proxy-zl", "none",
		"-o", file, "--raw", raw, "--configmap", "shuffle/cal", "--kubeconfig", kubeconfig}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("%v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	t.Log("\n" + stdout.String())
	for _, want := range []string{"calibration of machine", "bandwidth per worker", "request rates", "fitted parameters:", "slowRead", "podPullBandwidth", "slowCPU", "podCPU", "cores",
		"wrote the calibration to " + file, "created ConfigMap shuffle/cal (key calibration.json)"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("stdout lacks %q", want)
		}
	}
	for _, want := range []string{"starting redis-server and MinIO", "calibrating: 57 steps", "[57/57] redis server bandwidth", "measured in"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("progress lacks %q:\n%s", want, stderr.String())
		}
	}

	cal, err := model.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	if !cal.Calibrated() || cal.MeasuredOn.Kind != "machine" || cal.Params.WorkerStartup != 0.6 || cal.MeasuredOn.Details["maxObject"] != "10 MB" {
		t.Errorf("calibration %+v", cal.MeasuredOn)
	}
	if cal.Params.SlowRead == model.DefaultParams().SlowRead || !(cal.Params.PodPullBandwidth > 0) || len(cal.Params.FastRequests.Points) != 4 {
		t.Errorf("params not measured: %+v", cal.Params)
	}
	// --local: the servers are this machine's processes, so their CPU per
	// byte is measured, and the machine's cores are recorded
	if !cal.Params.PlatformCPUMeasured() || cal.Params.Cores != float64(runtime.NumCPU()) || !strings.HasPrefix(cal.MeasuredOn.Details["serverCPU"], "measured") ||
		!strings.HasPrefix(cal.MeasuredOn.Details["sidecarCPU"], "not measured (--queue-proxy-zl none)") {
		t.Errorf("platform CPU slow %+v fast %+v pod %+v, cores %v, details %q", cal.Params.SlowCPU, cal.Params.FastCPU, cal.Params.PodCPU,
			cal.Params.Cores, cal.MeasuredOn.Details["serverCPU"])
	}
	cm, err := kc.CoreV1().ConfigMaps("shuffle").Get(ctx, "cal", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fromCM, err := model.FromConfigMapData(cm.Data)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := fromCM.Marshal()
	b, _ := os.ReadFile(file)
	if !bytes.Equal(a, b) {
		t.Errorf("ConfigMap and file differ:\n%s\n%s", a, b)
	}
	if cm.Labels["app.kubernetes.io/component"] != "shuffle-calibration" {
		t.Errorf("labels %v", cm.Labels)
	}
	var m calibrate.Measurements
	if data, err := os.ReadFile(raw); err != nil || json.Unmarshal(data, &m) != nil || len(m.Bandwidth) != 40 || len(m.Rates) != 16 {
		t.Errorf("raw measurements: %v, %d bandwidth points, %d rates", err, len(m.Bandwidth), len(m.Rates))
	}

	// explain plans with it
	var out, errOut bytes.Buffer
	if err := runExplain([]string{"--calibration", file, "--size", "4GiB", "--fast-capacity", "1GiB"}, &out, &errOut); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), `parameters: calibrated on machine "`) || strings.Contains(out.String(), "UNCALIBRATED") {
		t.Errorf("explain did not use the calibration:\n%s", out.String())
	}

	// a second write updates the ConfigMap, keeping other keys
	cm.Data["other"] = "kept"
	if _, err := kc.CoreV1().ConfigMaps("shuffle").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	target, err := newConfigMapTarget(ctx, kubeconfig, "shuffle")
	if err != nil {
		t.Fatal(err)
	}
	if target.name != model.ConfigMapName {
		t.Errorf("default name %q", target.name)
	}
	target.name = "cal"
	cal.Notes = append(cal.Notes, "second run")
	if verb, err := target.write(ctx, cal); err != nil || verb != "updated" {
		t.Fatalf("%s, %v", verb, err)
	}
	cm, err = kc.CoreV1().ConfigMaps("shuffle").Get(ctx, "cal", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := model.FromConfigMapData(cm.Data); err != nil || got.Notes[len(got.Notes)-1] != "second run" || cm.Data["other"] != "kept" {
		t.Errorf("update: %v %v %v", err, got.Notes, cm.Data["other"])
	}
}

func TestCalibrateFlags(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--local"}, "-o FILE and/or --configmap"},
		{[]string{"-o", "x.json"}, "give --redis, --s3-endpoint and --s3-bucket"},
		{[]string{"-o", "x.json", "--local", "--redis", "127.0.0.1:6379"}, "leave out --redis"},
		{[]string{"-o", "x.json", "--redis", "h:1", "--s3-endpoint", "h:2", "--s3-bucket", "b"}, "--s3-access-key-file is required"},
		{[]string{"-o", "x.json", "--local", "--workers", "1,x"}, "--workers"},
		{[]string{"-o", "x.json", "--local", "--max-object", "ten"}, "--max-object"},
		{[]string{"-o", "x.json", "--local", "--duration-per-point", "0s"}, "--duration-per-point"},
		{[]string{"--configmap", "/name"}, "NAMESPACE/NAME"},
		{[]string{"-o", "x.json", "--local", "--queue-proxy-zl", "/nonexistent/queue-proxy-zl"}, "--queue-proxy-zl /nonexistent/queue-proxy-zl: not a file"},
		{[]string{"-o", "x.json", "--redis", "h:1", "--s3-endpoint", "h:2", "--s3-bucket", "b", "--queue-proxy-zl", "qp"}, "--queue-proxy-zl goes with --local"},
	} {
		var out, errOut bytes.Buffer
		err := runCalibrate(ctx, c.args, &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want %q", c.args, err, c.want)
		}
	}
}
