package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// upstreamBody is what the user container answers; small, so the numbers
// are queue-proxy's own and not buffered payload.
const upstreamBody = "hello from the user container\n"

// serveUpstream is the user container: 200 with a small body for anything.
func serveUpstream(addr string) error {
	srv := &http.Server{Addr: addr, ReadHeaderTimeout: time.Minute,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, upstreamBody)
		})}
	return srv.ListenAndServe()
}

// load sends n plain GET requests (no ziptrail content type, so the
// extension passes them through untouched) from conc keep-alive clients,
// and fails on the first unexpected answer.
func load(ctx context.Context, url string, n, conc int) error {
	tr := &http.Transport{MaxIdleConnsPerHost: conc, DisableCompression: true}
	// The connections close afterwards, as when the activator or ingress
	// goes idle; what stays is what queue-proxy keeps.
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, conc)
	for range conc {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				if err := get(ctx, client, url); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs // nil when closed and empty
}

func get(ctx context.Context, client *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || string(body) != upstreamBody {
		return fmt.Errorf("GET %s: %s %q", url, resp.Status, body)
	}
	return nil
}
