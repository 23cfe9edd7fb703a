package activatorext

import (
	"context"

	"github.com/ziptrail/ziptrail/internal/recovery"
)

// recovered ends a panic on a goroutine that handles outside input
// (deferred directly: recover only works there). activator-ext serves
// every namespace's cold starts, so no request may end the process: the
// panic is logged with its stack (recovery.Report) and counted in
// ziptrail.activator.panics, which the activator's OpenTelemetry
// exporter serves. The goroutine's own deferred cleanups have already run.
func recovered(ctx context.Context, m *Metrics, where string) {
	v := recover()
	if v == nil {
		return
	}
	m.panicked(ctx, where)
	recovery.Report("activator-ext", where, v)
}
