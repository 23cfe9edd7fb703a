package sidecar

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi"
)

// TestMessageFilesLentFromTheOutside: a member channel that asks to be
// lent large messages' files (docs/messaging.md, "Reused files"), driven
// as a careless or hostile function would: forged and stale tokens change
// nothing (a file still lent is never filled again), a real release makes
// the next message reuse the file, and an oversized release ends only
// that member channel (the membership stays: its next message arrives
// whole through the sidecar's recv).
//
// A release has no answer: the sidecar takes it back on the member
// channel's own reader while the next message comes from pod a on
// another path, so the test waits until b's sidecar took each release
// before it sends the message that must (or must not) reuse the files.
func TestMessageFilesLentFromTheOutside(t *testing.T) {
	op := messagingEnv(t)
	a := startMsgPod(t, op, "ns", "pod-a")
	taken := make(chan []string, 4)
	b := startMsgPod(t, op, "ns", "pod-b", func(c *Config) { c.releaseTaken = func(tokens []string) { taken <- tokens } })
	c := b.msgClient(t)
	c.LendFiles = true
	actx, acancel := within(time.Minute)
	mc, _, err := c.Attach(actx, "s1", "lend", 1, 2, false, "")
	acancel()
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	t.Cleanup(func() { mc.Close() })
	a.join(t, "s1", "lend", 0, 2, false)
	ctx, cancel := within(2 * time.Minute)
	defer cancel()
	const size = 1 << 20
	deliver := func(mc *localapi.MemberChannel, fill byte) *localapi.Received {
		t.Helper()
		if _, err := a.send(ctx, "s1", "lend", 0, 1, 0, bytes.Repeat([]byte{fill}, size)); err != nil {
			t.Fatalf("send %#x: %v", fill, err)
		}
		p := nextPush(t, mc)
		if p.Msg == nil || p.Msg.Path == "" {
			t.Fatalf("message %#x: not a file: %+v", fill, p)
		}
		got, err := os.ReadFile(p.Msg.Path)
		if err != nil || !bytes.Equal(got, bytes.Repeat([]byte{fill}, size)) {
			t.Fatalf("message %#x: %d bytes, %v", fill, len(got), err)
		}
		return p.Msg
	}
	release := func(tokens ...string) {
		t.Helper()
		mc.Release(tokens...)
		select {
		case got := <-taken:
			if strings.Join(got, ",") != strings.Join(tokens, ",") {
				t.Fatalf("the sidecar took the release %q, want %q", got, tokens)
			}
		case <-ctx.Done():
			t.Fatalf("the sidecar never took the release %q", tokens)
		}
	}
	held := deliver(mc, 1)
	if held.Token == "" || !strings.HasPrefix(held.Token, held.Path[strings.LastIndexByte(held.Path, '/')+1:]+":") {
		t.Fatalf("a lending member channel got no token for %s: %q", held.Path, held.Token)
	}
	name, _, _ := strings.Cut(held.Token, ":")
	// Forged and stale tokens: unknown names, a path, this file's other
	// lendings, no lending at all.
	release("nonsense", "get-nothere:1", "../../etc/passwd:1", name+":0", name+":999", name, ":", "")
	next := deliver(mc, 2)
	if next.Path == held.Path {
		t.Fatal("a forged release let the sidecar fill a file that is still lent")
	}
	if got, _ := os.ReadFile(held.Path); !bytes.Equal(got, bytes.Repeat([]byte{1}, size)) {
		t.Fatal("a lent file changed before its release")
	}
	// Released: the next message fills one of the released files again.
	release(held.Token, next.Token)
	third := deliver(mc, 3)
	if third.Path != held.Path && third.Path != next.Path {
		t.Fatalf("after their release the next message went to a new file %s (not %s or %s)", third.Path, held.Path, next.Path)
	}
	// An oversized release ends this member channel, and only it.
	mc.Release(strings.Repeat("x", 70<<10))
	ended := make(chan error, 1)
	go func() {
		for {
			p, err := mc.Next()
			if err != nil || p.Msg != nil {
				ended <- err
				return
			}
		}
	}()
	select {
	case err := <-ended:
		if err == nil {
			t.Fatal("the member channel went on after an oversized release (a message came)")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the member channel went on after an oversized release (not ended in 30 s)")
	}
	// Detached, the member still receives (through the sidecar's recv),
	// the next message whole, in a file that is its own.
	if _, err := a.send(ctx, "s1", "lend", 0, 1, 0, bytes.Repeat([]byte{4}, size)); err != nil {
		t.Fatal(err)
	}
	from, got, err := b.recv(ctx, "s1", "lend", 1, 0, 30_000)
	if err != nil || from != 0 || !bytes.Equal(got, bytes.Repeat([]byte{4}, size)) {
		t.Fatalf("after the detach: from %d, %d bytes, %v", from, len(got), err)
	}
}
