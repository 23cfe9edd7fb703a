package sidecar

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// The revision annotations queue-proxy-zl reads (the same strings as
// api/v1alpha1's Annotation* constants, which the Workflow controller
// writes; a test keeps them equal: the sidecar does not link the API
// package, which pulls in operator code).
const (
	annWorkflow        = "ziptrail.dev/workflow"
	annFunction        = "ziptrail.dev/function"
	annControlAddr     = "ziptrail.dev/control-addr"
	annMemoryLimit     = "ziptrail.dev/memory-limit"
	annInlineThreshold = "ziptrail.dev/inline-threshold"
	annObjectTTL       = "ziptrail.dev/object-ttl"
)

// PodInfoFile is where Knative mounts the revision's annotations into
// queue-proxy when config-features has queueproxy.mount-podinfo: enabled
// (knative.dev/serving v0.50.0 pkg/queue: PodInfoDirectory "/etc/podinfo",
// PodInfoAnnotationsFilename "annotations"; a downward API volume).
const PodInfoFile = "/etc/podinfo/annotations"

// MaxPodInfoBytes bounds the annotations file: the API server caps all of
// an object's annotations at 256 KiB, so a larger file is not Knative's.
const MaxPodInfoBytes = 256 << 10

// ParsePodInfo parses a downward API annotations file: one `key="value"`
// line per annotation, the value quoted as Go's %q does (the kubelet's
// fieldpath.FormatMap). Anything else (a line without `=`, an empty key,
// an unquoted or badly escaped value, a duplicate key, invalid UTF-8, more
// than MaxPodInfoBytes) is an error naming the line, never a panic.
func ParsePodInfo(data []byte) (map[string]string, error) {
	if len(data) > MaxPodInfoBytes {
		return nil, fmt.Errorf("podinfo annotations: %d bytes, more than the %d an object's annotations can hold", len(data), MaxPodInfoBytes)
	}
	if !utf8.Valid(data) {
		return nil, errors.New("podinfo annotations: not valid UTF-8")
	}
	out := map[string]string{}
	for i, line := range bytes.Split(data, []byte("\n")) {
		l := strings.TrimSuffix(string(line), "\r")
		if strings.TrimSpace(l) == "" {
			continue
		}
		if j := strings.IndexFunc(l, func(r rune) bool { return r < 0x20 || r == 0x7f }); j >= 0 {
			// %q escapes every control character: a raw one is not the kubelet's.
			return nil, fmt.Errorf("podinfo annotations line %d: raw control character at byte %d", i+1, j)
		}
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" || strings.ContainsAny(k, " \t\"") {
			return nil, fmt.Errorf("podinfo annotations line %d: want key=\"value\", got %.80q", i+1, l)
		}
		if len(v) < 2 || v[0] != '"' {
			return nil, fmt.Errorf("podinfo annotations line %d (%s): the value is not a quoted string", i+1, k)
		}
		val, err := strconv.Unquote(v)
		if err != nil {
			return nil, fmt.Errorf("podinfo annotations line %d (%s): bad quoted value: %v", i+1, k, err)
		}
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("podinfo annotations line %d: %s appears twice", i+1, k)
		}
		out[k] = val
	}
	return out, nil
}

// readPodInfo reads and parses the annotations file; a missing file is no
// error (nil map: queue-proxy-zl outside Knative, or podinfo not enabled).
func readPodInfo(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("podinfo annotations %s: %w", path, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxPodInfoBytes+1))
	if err != nil {
		return nil, fmt.Errorf("podinfo annotations %s: %w", path, err)
	}
	a, err := ParsePodInfo(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return a, nil
}

// applyPodInfo sets c's per-function settings from the revision's
// annotations (written by the Workflow controller). A malformed value is
// an error: a sidecar must not start with settings nobody asked for.
func (c *Config) applyPodInfo(a map[string]string) error {
	if v, ok := a[annWorkflow]; ok {
		c.Workflow = v
	}
	if v, ok := a[annFunction]; ok {
		c.Function = v
	}
	if v, ok := a[annControlAddr]; ok {
		c.OperatorAddr = v
	}
	if v, ok := a[annMemoryLimit]; ok {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			return fmt.Errorf("annotation %s=%q: want a positive number of bytes", annMemoryLimit, v)
		}
		c.MemoryLimit = n
	}
	if v, ok := a[annInlineThreshold]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return fmt.Errorf("annotation %s=%q: want a number of bytes", annInlineThreshold, v)
		}
		c.InlineThreshold = n
	}
	if v, ok := a[annObjectTTL]; ok {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return fmt.Errorf("annotation %s=%q: want a positive duration", annObjectTTL, v)
		}
		c.ObjectTTL = d
	}
	return nil
}

// Load is queue-proxy-zl's configuration in a cluster: Knative's SERVING_*
// environment, the per-function settings from the podinfo annotations
// file (PodInfoFile, or $ZIPTRAIL_PODINFO_FILE), and the projected token;
// storage tiers arrive later over the control stream. The ZIPTRAIL_*
// variables FromEnv reads override the annotations: they are for tests
// and --standalone, Knative never sets them on queue-proxy. A malformed
// annotations file is an error.
func Load() (Config, error) {
	c := FromEnv()
	path := envStr("ZIPTRAIL_PODINFO_FILE", PodInfoFile)
	a, err := readPodInfo(path)
	if err != nil {
		return c, err
	}
	base := c // the defaults where no ZIPTRAIL_* variable is set
	if err := base.applyPodInfo(a); err != nil {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	// Explicit ZIPTRAIL_* variables win over the annotations.
	if os.Getenv("ZIPTRAIL_WORKFLOW") == "" {
		c.Workflow = base.Workflow
	}
	if os.Getenv("ZIPTRAIL_FUNCTION") == "" {
		c.Function = base.Function
	}
	if os.Getenv("ZIPTRAIL_OPERATOR_ADDR") == "" {
		c.OperatorAddr = base.OperatorAddr
	}
	if os.Getenv("ZIPTRAIL_MEMORY_LIMIT") == "" {
		c.MemoryLimit = base.MemoryLimit
	}
	if os.Getenv("ZIPTRAIL_INLINE_THRESHOLD") == "" {
		c.InlineThreshold = base.InlineThreshold
	}
	if os.Getenv("ZIPTRAIL_OBJECT_TTL_SECONDS") == "" {
		c.ObjectTTL = base.ObjectTTL
	}
	return c, nil
}
