package sidecar

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi"
	"github.com/ziptrail/ziptrail/internal/dataplane/localapi/sidecarv1"
)

// TestMessagingWaitingReceives: receives that wait on the function's
// socket (no goroutine held: the stream reader hands them their message)
// get what a blocking Recv would. Per sender, messages arrive in order
// whether they met a waiting receive or a queue; each waiting receive
// gets the first message that matches it, and two ranks of one pod get
// their own; a receive whose caller gave up takes nothing; a receive
// waiting for a rank that leaves ends with PEER_GONE, one whose own rank
// leaves with GROUP_CLOSED; sends wait for and get the receiver's answer.
func TestMessagingWaitingReceives(t *testing.T) {
	op := messagingEnv(t)
	a := startMsgPod(t, op, "team-a", "pod-a")
	b := startMsgPod(t, op, "team-a", "pod-b")
	a.join(t, "s1", "w", 0, 3, false)
	b.join(t, "s1", "w", 1, 3, false)
	b.join(t, "s1", "w", 2, 3, false)
	fa := localapi.NewMessageClient(localapi.MessageSocket(a.s.cfg.APISocket))
	fb := localapi.NewMessageClient(localapi.MessageSocket(b.s.cfg.APISocket))
	defer fa.Close()
	defer fb.Close()
	ctx, cancel := within(2 * time.Minute)
	defer cancel()
	var me *localapi.MessageError

	// Order per pair: the receiver is sometimes waiting, sometimes not.
	const n = 300
	got := make(chan error, 1)
	go func() {
		got <- func() error {
			for i := range n {
				m, err := fb.Recv(ctx, "s1", "w", 1, false, 0, true, 0)
				if err != nil {
					return err
				}
				if want := fmt.Sprint(i); string(m.Data) != want || m.Tag != int64(i) {
					return fmt.Errorf("message %d: %q tag %d, want %q", i, m.Data, m.Tag, want)
				}
			}
			return nil
		}()
	}()
	for i := range n {
		if _, err := fa.Send(ctx, "s1", "w", 0, 1, int64(i), []byte(fmt.Sprint(i)), ""); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}

	// Filters: each waiting receive gets the message that matches it;
	// rank 2's receive is rank 2's.
	type res struct {
		m   *localapi.Received
		err error
	}
	recv := func(rank uint32, anyTag bool, tag int64) chan res {
		ch := make(chan res, 1)
		go func() {
			m, err := fb.Recv(ctx, "s1", "w", rank, true, 0, anyTag, tag)
			ch <- res{m, err}
		}()
		return ch
	}
	r1, r2, r3 := recv(1, false, 1), recv(1, false, 2), recv(2, true, 0)
	time.Sleep(100 * time.Millisecond) // let them wait (they may also find the messages queued)
	for _, s := range []struct {
		to  uint32
		tag int64
	}{{1, 2}, {2, 9}, {1, 1}} {
		if _, err := fa.Send(ctx, "s1", "w", 0, s.to, s.tag, []byte(fmt.Sprintf("to %d tag %d", s.to, s.tag)), ""); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		ch   chan res
		want string
	}{{r1, "to 1 tag 1"}, {r2, "to 1 tag 2"}, {r3, "to 2 tag 9"}} {
		if r := <-c.ch; r.err != nil || string(r.m.Data) != c.want {
			t.Fatalf("want %q: %+v, %v", c.want, r.m, r.err)
		}
	}

	// A receive whose caller gives up takes nothing.
	gctx, gcancel := context.WithCancel(ctx)
	gave := make(chan error, 1)
	go func() {
		_, err := fb.Recv(gctx, "s1", "w", 1, true, 0, true, 0)
		gave <- err
	}()
	time.AfterFunc(100*time.Millisecond, gcancel)
	if err := <-gave; !errors.As(err, &me) || me.Reason != localapi.ReasonMsgTimeout {
		t.Fatalf("a receive given up: %v, want %s", err, localapi.ReasonMsgTimeout)
	}
	if _, err := fa.Send(ctx, "s1", "w", 0, 1, 5, []byte("after"), ""); err != nil {
		t.Fatal(err)
	}
	if m, err := fb.Recv(ctx, "s1", "w", 1, true, 0, true, 0); err != nil || string(m.Data) != "after" {
		t.Fatalf("the message after a given-up receive: %+v, %v", m, err)
	}

	// Ends: the sender leaves (PEER_GONE), the receiver's own rank leaves
	// (GROUP_CLOSED).
	fromZero := make(chan res, 1)
	go func() {
		m, err := fb.Recv(ctx, "s1", "w", 2, false, 0, true, 0)
		fromZero <- res{m, err}
	}()
	own := recv(1, true, 0)
	time.Sleep(100 * time.Millisecond)
	if _, err := a.sdk.RPC().Leave(ctx, &sidecarv1.LeaveRequest{Session: "s1", Group: "w", Rank: 0}); err != nil {
		t.Fatal(err)
	}
	if r := <-fromZero; !errors.As(r.err, &me) || me.Reason != localapi.ReasonPeerGone {
		t.Fatalf("waiting for a rank that left: %+v, %v; want %s", r.m, r.err, localapi.ReasonPeerGone)
	}
	if _, err := b.sdk.RPC().Leave(ctx, &sidecarv1.LeaveRequest{Session: "s1", Group: "w", Rank: 1}); err != nil {
		t.Fatal(err)
	}
	if r := <-own; !errors.As(r.err, &me) || me.Reason != localapi.ReasonGroupClosed {
		t.Fatalf("waiting as a rank that left: %+v, %v; want %s", r.m, r.err, localapi.ReasonGroupClosed)
	}
}

// TestMessagingPooledBodies: the sidecars reuse the buffers of inline
// bodies of 4-66 KiB once a function has a message; messages queued
// while others are sent and received keep their own bytes (a buffer given
// back too early would show another message's bytes).
func TestMessagingPooledBodies(t *testing.T) {
	op := messagingEnv(t)
	a := startMsgPod(t, op, "team-a", "pod-a")
	b := startMsgPod(t, op, "team-a", "pod-b")
	a.join(t, "s1", "p", 0, 2, false)
	b.join(t, "s1", "p", 1, 2, false)
	fa := localapi.NewMessageClient(localapi.MessageSocket(a.s.cfg.APISocket))
	fb := localapi.NewMessageClient(localapi.MessageSocket(b.s.cfg.APISocket))
	defer fa.Close()
	defer fb.Close()
	ctx, cancel := within(2 * time.Minute)
	defer cancel()
	body := func(i int) []byte { return bytes.Repeat([]byte{byte(i)}, 5000+i*1000) }
	const n = 40
	// The first half waits in the receiver's queue, the second half meets
	// receives under way.
	for i := range n / 2 {
		if _, err := fa.Send(ctx, "s1", "p", 0, 1, int64(i), body(i), ""); err != nil {
			t.Fatal(err)
		}
	}
	got := make(chan error, 1)
	go func() {
		got <- func() error {
			for i := range n {
				m, err := fb.Recv(ctx, "s1", "p", 1, false, 0, true, 0)
				if err != nil {
					return err
				}
				if m.Tag != int64(i) || !bytes.Equal(m.Data, body(i)) {
					return fmt.Errorf("message %d: tag %d, %d bytes, not its own", i, m.Tag, len(m.Data))
				}
			}
			return nil
		}()
	}()
	for i := n / 2; i < n; i++ {
		if _, err := fa.Send(ctx, "s1", "p", 0, 1, int64(i), body(i), ""); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}
