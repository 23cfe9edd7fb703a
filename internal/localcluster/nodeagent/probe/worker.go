package probe

import (
	"context"
	"crypto/tls"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Result is the outcome of one probe run as seen through the thresholds.
type Result struct {
	Success bool  // the probe's current result after thresholds
	Changed bool  // Success differs from the previous result
	Err     error // the failure of this run (nil on success)
	Failed  bool  // failureThreshold consecutive failures reached
	// Quiet marks an extra run of the eager phase; report its failure
	// (events) only once per period.
	Quiet bool
}

// Worker runs one probe of one container periodically.
type Worker struct {
	Probe  *corev1.Probe
	Target Target
	// Initial is the result before the first threshold is reached (false
	// for readiness and startup, true for liveness).
	Initial bool
	// Report is called after each run, from the worker's goroutine.
	Report func(Result)
	// Eager, when set, is the interval between runs until the probe first
	// succeeds (if shorter than periodSeconds). The kubelet re-triggers the
	// readiness probe of a not-yet-ready container on every pod sync, so a
	// fresh container turns Ready long before a 10 s period ends.
	Eager time.Duration
}

// Run probes until ctx ends: first after initialDelaySeconds, then every
// periodSeconds, each run bounded by timeoutSeconds.
func (w *Worker) Run(ctx context.Context) {
	p := w.Probe
	period := seconds(p.PeriodSeconds, 10)
	timeout := seconds(p.TimeoutSeconds, 1)
	success, failure := int(p.SuccessThreshold), int(p.FailureThreshold)
	if success <= 0 {
		success = 1
	}
	if failure <= 0 {
		failure = 3
	}
	if !sleep(ctx, time.Duration(p.InitialDelaySeconds)*time.Second) {
		return
	}
	result, okRun, badRun := w.Initial, 0, 0
	eager := w.Eager > 0 && w.Eager < period
	interval := period
	if eager {
		interval = w.Eager
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	var lastLoud time.Time
	for {
		runCtx, cancel := context.WithTimeout(ctx, timeout)
		err := Run(runCtx, FromProbe(p), w.Target)
		cancel()
		if ctx.Err() != nil {
			return
		}
		prev := result
		if err == nil {
			okRun, badRun = okRun+1, 0
			if okRun >= success {
				result = true
			}
		} else {
			okRun, badRun = 0, badRun+1
			if badRun >= failure {
				result = false
			}
		}
		quiet := eager && time.Since(lastLoud) < period
		if !quiet {
			lastLoud = time.Now()
		}
		if eager && err == nil {
			eager = false
			t.Reset(period)
		}
		w.Report(Result{Success: result, Changed: result != prev, Err: err, Failed: err != nil && badRun >= failure, Quiet: quiet})
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func seconds(v int32, def int) time.Duration {
	if v <= 0 {
		return time.Duration(def) * time.Second
	}
	return time.Duration(v) * time.Second
}

func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func killGroup(pid int) error { return syscall.Kill(-pid, syscall.SIGKILL) }

// insecureTLS: like the kubelet, HTTPS probes do not verify certificates.
func insecureTLS() *tls.Config { return &tls.Config{InsecureSkipVerify: true} } //nolint:gosec // kubelet behaviour
