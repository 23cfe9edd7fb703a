// Command directpeer is a Go group member for the Python SDK's mixed
// tests of same-node direct channels (tests/test_group_direct.py): it
// attaches a rank through its pod's sidecar with the Go client of the
// messaging socket (internal/dataplane/localapi) and speaks the Go framing
// of direct channels (internal/dataplane/directmsg), the code the Go SDK
// uses. Once its view lists the peer it prints LIVE, then echoes every
// message the Python peer sends it over the peer's direct channel back
// over its own, n times, then prints DONE. Its echoes of 128 KiB-4 MiB
// go as copy frames (kind 4) in the memfds it reuses, larger ones as
// sealed memfds (kind 2), as the Go SDK sends them.
//
// A message of the peer's that comes through the sidecar path instead
// (its open was answered nodirect) fails the run at once, naming it: the
// test is about direct channels.
//
//	directpeer -socket <api socket> -session s -group g -rank 1 -size 2 -peer 0 -n 10
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/directmsg"
	"github.com/ziptrail/ziptrail/internal/dataplane/localapi"
	"github.com/ziptrail/ziptrail/internal/dataplane/samenode"
)

func main() {
	socket := flag.String("socket", "", "the pod's local API socket")
	session := flag.String("session", "", "session")
	group := flag.String("group", "g", "group")
	rank := flag.Uint("rank", 1, "this member's rank")
	size := flag.Uint("size", 2, "the group's size")
	peer := flag.Uint("peer", 0, "the Python member's rank")
	n := flag.Int("n", 1, "messages to echo")
	flag.Parse()
	if err := run(*socket, *session, *group, uint32(*rank), uint32(*size), uint32(*peer), *n); err != nil {
		fmt.Fprintf(os.Stderr, "directpeer: %v\n", err)
		fmt.Println("FAILED", err)
		os.Exit(1)
	}
	fmt.Println("DONE")
}

func run(socket, session, group string, rank, size, peer uint32, n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := localapi.NewMessageClient(localapi.MessageSocket(socket))
	c.TCPChannels = true // a peer on another node: a TCP channel (directmsg.NewConn reads both)
	defer c.Close()
	mc, _, err := c.Attach(ctx, session, group, rank, size, false, "")
	if err != nil {
		return fmt.Errorf("attach: %w", err)
	}
	defer mc.Close()
	live := make(chan struct{})
	in := make(chan *directmsg.Conn, 1)
	bad := make(chan error, 1)
	go func() {
		seen := false
		for {
			p, err := mc.Next()
			if err != nil {
				return
			}
			switch {
			case p.View != nil && !seen && slices.Contains(p.View.Live, peer):
				seen = true
				close(live)
			case p.Direct != nil && p.From == peer:
				conn, err := directmsg.NewConn(p.Direct)
				if err != nil {
					bad <- fmt.Errorf("the peer's direct channel: %w", err)
					return
				}
				in <- conn
			case p.Direct != nil:
				_ = p.Direct.Close()
			case p.Msg != nil:
				if p.Msg.Path != "" {
					_ = os.Remove(p.Msg.Path)
				}
				select {
				case bad <- fmt.Errorf("a message from rank %d (tag %d, %d bytes) came through the sidecar path, not a direct channel",
					p.Msg.From, p.Msg.Tag, p.Msg.Size):
				default:
				}
			}
		}
	}()
	select {
	case <-live:
	case err := <-bad:
		return err
	case <-ctx.Done():
		return errors.New("the peer never joined")
	}
	fmt.Println("LIVE")
	// The peer's channel first: the peer sends once its view lists this
	// rank (it joined waiting for all), so its sidecar, which decides
	// this rank's open, knows this rank too.
	var src *directmsg.Conn
	select {
	case src = <-in:
	case err := <-bad:
		return err
	case <-ctx.Done():
		return errors.New("no direct channel from the peer")
	}
	defer src.Close()
	f, err := c.Open(ctx, session, group, rank, peer)
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	if f == nil {
		return errors.New("open: nodirect")
	}
	out, err := directmsg.NewConn(f)
	if err != nil {
		return err
	}
	defer out.Close()
	for i := range n {
		m, err := src.Recv()
		if err != nil {
			return fmt.Errorf("message %d: %w", i, err)
		}
		err = out.Send(ctx, m.Tag, m.Data)
		if m.Mapped {
			_ = samenode.Unmap(m.Data)
		}
		if err != nil {
			return fmt.Errorf("echo %d: %w", i, err)
		}
	}
	select {
	case err := <-bad:
		return err
	default:
	}
	return nil
}
