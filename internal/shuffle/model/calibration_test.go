package model

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func measured() Calibration {
	c := DefaultCalibration()
	c.Time = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	c.MeasuredOn = MeasuredOn{Kind: "machine", Name: "devbox", Details: map[string]string{"cores": "2"}}
	c.Params.FastShards = 3
	c.Params.PodAggregateBandwidth = 4e9
	c.Notes = []string{"fit residual 3 %"}
	return c
}

func TestCalibrationFileRoundTrip(t *testing.T) {
	c := measured()
	path := filepath.Join(t.TempDir(), "calibration.json")
	if err := c.Save(path); err != nil {
		t.Fatal(err)
	}
	got, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, c) {
		t.Errorf("loaded %+v\nwant %+v", got, c)
	}
	if !got.Calibrated() || DefaultCalibration().Calibrated() {
		t.Error("Calibrated: a measured calibration is, the defaults are not")
	}
	raw, _ := os.ReadFile(path)
	for _, want := range []string{`"version": 1`, `"time": "2026-03-01T12:00:00Z"`, `"slowRequests"`, `"stragglers"`} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("file lacks %s:\n%s", want, raw)
		}
	}
	if strings.Contains(func() string { b, _ := DefaultCalibration().Marshal(); return string(b) }(), `"time"`) {
		t.Error("the defaults carry a time")
	}
}

func TestCalibrationRejects(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"typo":    strings.Replace(mustMarshal(t, measured()), `"fastShards"`, `"fastShard"`, 1),
		"version": strings.Replace(mustMarshal(t, measured()), `"version": 1`, `"version": 9`, 1),
		"invalid": strings.Replace(mustMarshal(t, measured()), `"fastShards": 3`, `"fastShards": 0`, 1),
		"garbage": "{",
	} {
		path := filepath.Join(dir, name+".json")
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(path); err == nil {
			t.Errorf("%s: loaded", name)
		}
	}
}

func mustMarshal(t *testing.T, c Calibration) string {
	t.Helper()
	b, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestCalibrationConfigMap(t *testing.T) {
	c := measured()
	data, err := c.ConfigMapData()
	if err != nil {
		t.Fatal(err)
	}
	if len(data) != 1 || data["calibration.json"] == "" {
		t.Fatalf("data %v", data)
	}
	got, err := FromConfigMapData(data)
	if err != nil || !reflect.DeepEqual(got, c) {
		t.Errorf("from data: %v %+v", err, got)
	}
	if _, err := FromConfigMapData(map[string]string{"other": "{}"}); err == nil {
		t.Error("no key: no error")
	}
	manifest, err := c.ConfigMapManifest("ziptrail-system", ConfigMapName)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"apiVersion": "v1"`, `"kind": "ConfigMap"`, `"name": "ziptrail-shuffle-calibration"`, `"namespace": "ziptrail-system"`, `"calibration.json": "{\n  \"version\": 1`} {
		if !strings.Contains(string(manifest), want) {
			t.Errorf("manifest lacks %s:\n%s", want, manifest)
		}
	}
	got, err = FromConfigMapManifest(manifest)
	if err != nil || !reflect.DeepEqual(got, c) {
		t.Errorf("from manifest: %v %+v", err, got)
	}
}
