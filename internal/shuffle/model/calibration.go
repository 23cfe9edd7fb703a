package model

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Calibration is a stored set of fitted Params: what `ziptrail calibrate`
// writes (a file locally, a ConfigMap on a cluster) and `ziptrail explain`
// and the shuffle library read.
type Calibration struct {
	// Version is the format's version, CalibrationVersion.
	Version int `json:"version"`
	// Time is when the measurements were taken; zero for the built-in
	// defaults (which are not a calibration at all).
	Time time.Time `json:"time,omitzero"`
	// MeasuredOn is the machine or cluster measured.
	MeasuredOn MeasuredOn `json:"measuredOn"`
	Params     Params     `json:"params"`
	// Notes are free-form remarks (benchmark settings, fit residuals).
	Notes []string `json:"notes,omitempty"`
}

// MeasuredOn names what a calibration measured.
type MeasuredOn struct {
	// Kind is "machine" (a local cluster), "cluster" or "defaults".
	Kind string `json:"kind"`
	// Name is the host name or the cluster's kubeconfig context.
	Name string `json:"name"`
	// Details are facts such as cores, memory, node count, Redis and S3
	// endpoints and versions.
	Details map[string]string `json:"details,omitempty"`
}

// CalibrationVersion is the version Save writes and Load accepts.
const CalibrationVersion = 1

// ConfigMapKey is the data key of a calibration in its ConfigMap, and
// ConfigMapName the ConfigMap's default name (in the operator's namespace).
const (
	ConfigMapKey  = "calibration.json"
	ConfigMapName = "ziptrail-shuffle-calibration"
)

// DefaultCalibration is the built-in defaults wrapped as a calibration that
// says it is not one (Calibrated reports false).
func DefaultCalibration() Calibration {
	return Calibration{
		Version: CalibrationVersion,
		MeasuredOn: MeasuredOn{Kind: "defaults", Name: "built-in defaults",
			Details: map[string]string{"source": "Locus (NSDI '19) AWS Lambda/S3/ElastiCache measurements, Table 1, Fig. 2, Fig. 4; pod-memory numbers assumed"}},
		Params: DefaultParams(),
	}
}

// Calibrated says whether c was measured (rather than the built-in
// defaults).
func (c Calibration) Calibrated() bool { return !c.Time.IsZero() && c.MeasuredOn.Kind != "defaults" }

// Validate checks the version and the params.
func (c Calibration) Validate() error {
	if c.Version != CalibrationVersion {
		return fmt.Errorf("calibration version %d, want %d", c.Version, CalibrationVersion)
	}
	if err := c.Params.Validate(); err != nil {
		return fmt.Errorf("calibration params: %w", err)
	}
	return nil
}

// Marshal encodes c as indented JSON (the file format and the ConfigMap
// value).
func (c Calibration) Marshal() ([]byte, error) {
	if c.Version == 0 {
		c.Version = CalibrationVersion
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// UnmarshalCalibration decodes and validates a calibration; unknown fields
// are errors (a typo would otherwise silently keep a default).
func UnmarshalCalibration(data []byte) (Calibration, error) {
	var c Calibration
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return Calibration{}, fmt.Errorf("calibration: %w", err)
	}
	if dec.More() {
		return Calibration{}, errors.New("calibration: trailing data after the JSON object")
	}
	if err := c.Validate(); err != nil {
		return Calibration{}, err
	}
	return c, nil
}

// Save writes c to path atomically (a temporary file renamed over it).
func (c Calibration) Save(path string) error {
	b, err := c.Marshal()
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".calibration-*.json")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// Load reads a calibration file.
func Load(path string) (Calibration, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Calibration{}, err
	}
	c, err := UnmarshalCalibration(b)
	if err != nil {
		return Calibration{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// ConfigMapData is c as a ConfigMap's data: {ConfigMapKey: JSON}.
func (c Calibration) ConfigMapData() (map[string]string, error) {
	b, err := c.Marshal()
	if err != nil {
		return nil, err
	}
	return map[string]string{ConfigMapKey: string(b)}, nil
}

// FromConfigMapData reads a calibration from a ConfigMap's data.
func FromConfigMapData(data map[string]string) (Calibration, error) {
	v, ok := data[ConfigMapKey]
	if !ok {
		return Calibration{}, fmt.Errorf("ConfigMap has no %q key", ConfigMapKey)
	}
	return UnmarshalCalibration([]byte(v))
}

// configMap is the shape of a core/v1 ConfigMap, enough to write one
// without the Kubernetes libraries.
type configMap struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string            `json:"name"`
		Namespace string            `json:"namespace,omitempty"`
		Labels    map[string]string `json:"labels,omitempty"`
	} `json:"metadata"`
	Data map[string]string `json:"data"`
}

// ConfigMapManifest is c as a ConfigMap manifest (JSON, which kubectl
// apply accepts) named name in namespace.
func (c Calibration) ConfigMapManifest(namespace, name string) ([]byte, error) {
	data, err := c.ConfigMapData()
	if err != nil {
		return nil, err
	}
	cm := configMap{APIVersion: "v1", Kind: "ConfigMap", Data: data}
	cm.Metadata.Name, cm.Metadata.Namespace = name, namespace
	cm.Metadata.Labels = map[string]string{"app.kubernetes.io/part-of": "ziptrail", "app.kubernetes.io/component": "shuffle-calibration"}
	b, err := json.MarshalIndent(cm, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// FromConfigMapManifest reads a calibration from a ConfigMap manifest in
// JSON (as ConfigMapManifest writes it, or `kubectl get -o json` prints
// it).
func FromConfigMapManifest(manifest []byte) (Calibration, error) {
	var cm configMap
	if err := json.Unmarshal(manifest, &cm); err != nil {
		return Calibration{}, fmt.Errorf("ConfigMap: %w", err)
	}
	if cm.Kind != "ConfigMap" {
		return Calibration{}, fmt.Errorf("kind %q, want ConfigMap", cm.Kind)
	}
	return FromConfigMapData(cm.Data)
}
