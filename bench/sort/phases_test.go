package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/operator/sessions"
)

// TestInvocationLog: snapshots of a session, polled while it runs, give
// each function's invocations once however often an event is seen again;
// events the session dropped before a poll saw them are counted missed.
func TestInvocationLog(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 9, 0, 0, 0, time.UTC)
	ev := func(s float64, kind, msg string) sessions.Event {
		return sessions.Event{Time: t0.Add(time.Duration(s * float64(time.Second))), Kind: kind, Message: msg}
	}
	all := []sessions.Event{
		ev(0, "Started", "session started"),
		ev(0.5, "Invoked", "split with 1 objects (trigger input)"),
		ev(1, "Invoked", "map with 1 objects (trigger tasks)"),
		ev(1.5, "ObjectReady", "shuffle-r0/p0/m0"),
		ev(3, "Invoked", "map with 1 objects (trigger tasks)"),
		ev(10, "Invoked", "merge with 2 objects (trigger shuffle-r0)"),
		ev(12, "Invoked", "merge with 2 objects (trigger shuffle-r0)"),
		ev(20, "Invoked", "collect with 2 objects (trigger parts)"),
	}
	l := newInvocationLog()
	l.add(sessions.Session{Started: t0, Events: all[:3]})
	l.add(sessions.Session{Started: t0, Events: all[:5]}) // seen again: counted once
	// the session kept its last 2 events only: events 5 and 6 are lost
	l.add(sessions.Session{Started: t0, Events: all[7:], FirstEvent: 7})
	got, missed := l.times()
	want := []FunctionTimes{{"split", 1, 0.5, 0.5}, {"map", 2, 1, 3}, {"collect", 1, 20, 20}}
	if len(got) != len(want) || missed != 2 {
		t.Fatalf("got %+v, missed %d; want %+v, missed 2", got, missed, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("function %d: %+v, want %+v", i, got[i], want[i])
		}
	}

	// without a loss, merge's two invocations are both there
	l = newInvocationLog()
	l.add(sessions.Session{Started: t0, Events: all})
	got, missed = l.times()
	if missed != 0 || len(got) != 4 || got[2] != (FunctionTimes{"merge", 2, 10, 12}) {
		t.Errorf("got %+v, missed %d", got, missed)
	}
}

// TestCoresLeft: a run gets its machine's cores minus the cores the rest of
// the machine used while it ran (cpushare.py's coresOthers), matched by
// size and method; a run not in the file gets 0 (the calibration's).
func TestCoresLeft(t *testing.T) {
	f := filepath.Join(t.TempDir(), "cpu.json")
	if err := os.WriteFile(f, []byte(`{"tree": [
		{"step": 1, "size": "1024 MiB", "method": "s3", "coresGot": 0.9, "coresOthers": 1.1},
		{"step": 6, "size": "2.00 GiB", "method": "s3", "coresGot": 1.22, "coresOthers": 0.78},
		{"step": 7, "size": "2.00 GiB", "method": "hybrid", "coresGot": 1.9, "coresOthers": 2.5}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	left, err := coresLeftFrom(f, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		bytes  int64
		method string
		want   float64
	}{
		{1073741800, "s3", 0.9}, {2147483600, "s3", 1.22}, {2147483600, "podmemory", 0},
		{4294967200, "s3", 0},
		{2147483600, "hybrid", 0.1}, // others used more than the machine has (sampling): a tenth of a core, not 0 or less
	} {
		if got := left(Run{Bytes: c.bytes, Method: c.method}); got < c.want-1e-9 || got > c.want+1e-9 {
			t.Errorf("%d B via %s: %v cores, want %v", c.bytes, c.method, got, c.want)
		}
	}
	if _, err := coresLeftFrom(f, 0); err == nil || !strings.Contains(err.Error(), "no cores") {
		t.Errorf("no machine cores: %v", err)
	}
	if err := os.WriteFile(f, []byte(`{"tree": []}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := coresLeftFrom(f, 2); err == nil {
		t.Error("a file without runs accepted")
	}
}
