package messaging

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestRaw: raw reads and writes of a socket behave as the net.Conn's: a
// write larger than the socket's buffer waits for the reader and arrives
// whole, the peer's close is io.EOF, a read deadline ends a read with
// os.ErrDeadlineExceeded, and a closed conn fails.
func TestRaw(t *testing.T) {
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	a, err := net.Dial("unix", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b := <-accepted
	if b == nil {
		t.Fatal("accept failed")
	}
	ra, rb := Raw(a), Raw(b)
	if _, ok := ra.(*rawIO); !ok {
		t.Fatalf("Raw of a unix socket is a %T", ra)
	}

	big := make([]byte, 8<<20)
	_, _ = rand.Read(big)
	wrote := make(chan error, 1)
	go func() {
		n, err := ra.Write(big)
		if err == nil && n != len(big) {
			err = io.ErrShortWrite
		}
		wrote <- err
	}()
	got := make([]byte, len(big))
	if _, err := io.ReadFull(rb, got); err != nil {
		t.Fatal(err)
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, big) {
		t.Fatal("the bytes differ")
	}

	_ = b.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
	if _, err := rb.Read(got[:1]); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past its deadline: %v", err)
	}
	_ = b.SetReadDeadline(time.Time{})
	a.Close()
	if _, err := rb.Read(got[:1]); err != io.EOF {
		t.Fatalf("read after the peer closed: %v, want EOF", err)
	}
	b.Close()
	if _, err := rb.Write([]byte("x")); err == nil {
		t.Fatal("write on a closed conn succeeded")
	}
}
