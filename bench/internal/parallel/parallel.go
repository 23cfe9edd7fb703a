// Package parallel runs a benchmark's setup steps side by side.
package parallel

import "sync"

// Do runs f(0) … f(n-1) at once and returns an error of one that failed
// (nil when none did), after all have returned.
func Do(n int, f func(i int) error) error {
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- f(i) }()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
