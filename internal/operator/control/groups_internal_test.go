package control

import (
	"sync"
	"testing"
	"time"
)

// TestStreamEndedWhileTheDirectoryIsMade: a stream that ends while
// another stream's first group message makes the directory (groups())
// must not read Server.Groups unsynchronized. The e2e suite's race
// detector reported exactly that pair; under -race (make test) this test
// fails without the fix.
func TestStreamEndedWhileTheDirectoryIsMade(t *testing.T) {
	for range 50 {
		s := &Server{StreamGrace: time.Millisecond}
		var wg sync.WaitGroup
		wg.Go(func() { s.streamEnded(&conn{sid: 1}) })
		wg.Go(func() { _ = s.groups() })
		wg.Wait()
		if s.groups() == nil {
			t.Fatal("no directory")
		}
	}
}
