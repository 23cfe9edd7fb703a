package activatorext

import (
	"context"
	"log"
	"runtime/debug"
)

// recovered ends a panic on a goroutine that handles outside input
// (deferred directly: recover only works there). activator-ext serves
// every namespace's cold starts, so no request may end the process: the
// panic is logged with its stack and counted in ziptrail.activator.panics.
// The goroutine's own deferred cleanups have already run.
func recovered(ctx context.Context, m *Metrics, where string) {
	v := recover()
	if v == nil {
		return
	}
	m.panicked(ctx, where)
	log.Printf("activator-ext: recovered a panic in %s (a defect; the request's keep-alive ends): %v\n%s", where, v, debug.Stack())
}
