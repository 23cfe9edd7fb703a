// Package guardtest plays hostile clients against a gRPC server from the
// outside: gRPC calls over a raw HTTP/2 connection whose request message
// is generated as it is sent (so the client holds none of it, and the
// heap a test measures is the server's), or that stops in the middle of
// its message.
package guardtest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protowire"
)

// Result is how a raw call ended.
type Result struct {
	Code codes.Code
	Msg  string
	// Sent is how many bytes of the request body (gRPC frame included)
	// the client wrote before the call ended.
	Sent int64
}

func (r Result) String() string { return fmt.Sprintf("%s: %s (%d bytes sent)", r.Code, r.Msg, r.Sent) }

// Call makes one gRPC call to addr (plaintext HTTP/2) on a connection of
// its own, sending body as the request stream, with "authorization:
// Bearer token" unless token is empty. It returns the status the server
// answered; an error means the server answered no gRPC status at all
// (the connection was refused or broken).
func Call(ctx context.Context, addr, method, token string, body io.Reader) (Result, error) {
	tr := &http.Transport{Protocols: new(http.Protocols), DisableCompression: true}
	tr.Protocols.SetUnencryptedHTTP2(true)
	defer tr.CloseIdleConnections()
	cb := &countingReader{r: body}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+method, cb)
	if err != nil {
		return Result{}, err
	}
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("TE", "trailers")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return Result{Sent: cb.n.Load()}, err
	}
	defer resp.Body.Close()
	if s := resp.Header.Get("Grpc-Status"); s != "" { // trailers-only answer
		return result(s, resp.Header.Get("Grpc-Message"), cb.n.Load()), nil
	}
	_, rerr := io.Copy(io.Discard, resp.Body)
	if s := resp.Trailer.Get("Grpc-Status"); s != "" {
		return result(s, resp.Trailer.Get("Grpc-Message"), cb.n.Load()), nil
	}
	return Result{Sent: cb.n.Load()}, fmt.Errorf("no gRPC status (HTTP %d, body: %v)", resp.StatusCode, rerr)
}

func result(code, msg string, sent int64) Result {
	n, _ := strconv.Atoi(code)
	return Result{Code: codes.Code(n), Msg: decodeMsg(msg), Sent: sent}
}

// decodeMsg undoes grpc-message's percent-encoding.
func decodeMsg(s string) string {
	var out []byte
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+3], 16, 8); err == nil {
				out = append(out, byte(v))
				i += 2
				continue
			}
		}
		out = append(out, s[i])
	}
	return string(out)
}

type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// BytesMessage is one gRPC request frame (uncompressed) holding a
// protobuf message: prefix (the message's other fields, already encoded),
// then bytes field `field` of n zero bytes, generated as it is read.
func BytesMessage(prefix []byte, field protowire.Number, n int64) io.Reader {
	head := append([]byte(nil), prefix...)
	head = protowire.AppendTag(head, field, protowire.BytesType)
	head = protowire.AppendVarint(head, uint64(n))
	return io.MultiReader(bytes.NewReader(Frame(int64(len(head))+n)), bytes.NewReader(head), io.LimitReader(zeros{}, n))
}

// Frame is the 5-byte header of an uncompressed gRPC message of n bytes.
func Frame(n int64) []byte {
	h := make([]byte, 5)
	binary.BigEndian.PutUint32(h[1:], uint32(n))
	return h
}

// Stall sends r, then blocks until ctx ends (a client that stopped in the
// middle of its message). Reading it after ctx ended returns ctx's error.
func Stall(ctx context.Context, r io.Reader) io.Reader {
	return io.MultiReader(r, stalled{ctx})
}

type stalled struct{ ctx context.Context }

func (s stalled) Read([]byte) (int, error) {
	<-s.ctx.Done()
	return 0, s.ctx.Err()
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// CountingListener counts the bytes the server reads from every connection
// it accepts.
type CountingListener struct {
	net.Listener
	Read atomic.Int64
}

func (l *CountingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, n: &l.Read}, nil
}

type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// Refused reports whether the server at addr closes a new connection
// without a word: it dials, sends the HTTP/2 preface and waits up to the
// context's end for the server's SETTINGS. A server that answers is not
// refusing; conn is then left open (the caller closes it).
func Refused(ctx context.Context, addr string) (refused bool, conn net.Conn, err error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return true, nil, nil // not even accepted by the kernel
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"); err != nil {
		c.Close()
		return true, nil, nil
	}
	// An empty SETTINGS frame from the client.
	if _, err := c.Write([]byte{0, 0, 0, 4, 0, 0, 0, 0, 0}); err != nil {
		c.Close()
		return true, nil, nil
	}
	var hdr [9]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		c.Close()
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return false, nil, fmt.Errorf("the server neither answered nor closed the connection: %w", err)
		}
		return true, nil, nil
	}
	_ = c.SetDeadline(time.Time{})
	return false, c, nil
}

// Idle opens a connection that sends the HTTP/2 preface and nothing more:
// a client that never authenticates.
func Idle(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if _, err := io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"); err != nil {
		c.Close()
		return nil, err
	}
	if _, err := c.Write([]byte{0, 0, 0, 4, 0, 0, 0, 0, 0}); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Closed reports whether the server closed c within the context's time
// (reading and discarding what it sends meanwhile).
func Closed(ctx context.Context, c net.Conn) bool {
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetReadDeadline(dl)
	}
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// HeapWatch samples the process's heap in use (runtime.MemStats.HeapInuse)
// every 10ms until Stop. It lowers the GC target meanwhile (GOGC 5), so
// the heap holds little more than what is retained: what a server buffers.
type HeapWatch struct {
	base, max uint64
	oldGC     int
	stop      chan struct{}
	done      chan struct{}
	mu        sync.Mutex
}

// WatchHeap starts sampling.
func WatchHeap() *HeapWatch {
	w := &HeapWatch{oldGC: debug.SetGCPercent(5), stop: make(chan struct{}), done: make(chan struct{})}
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	w.base, w.max = m.HeapInuse, m.HeapInuse
	go func() {
		defer close(w.done)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			w.mu.Lock()
			w.max = max(w.max, m.HeapInuse)
			w.mu.Unlock()
		}
	}()
	return w
}

// Stop ends the sampling and returns by how much the heap in use grew
// at most over its size at the start.
func (w *HeapWatch) Stop() int64 {
	select {
	case <-w.stop:
	default:
		close(w.stop)
		<-w.done
		debug.SetGCPercent(w.oldGC)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return int64(w.max) - int64(w.base)
}
