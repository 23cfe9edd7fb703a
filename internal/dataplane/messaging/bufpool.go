package messaging

import "sync"

// Buffers for the bodies of inline messages (up to 64 KiB) that a sidecar
// reads and writes again: the function's send request, a message read
// off the stream. At 64 KB a message allocated two of them in each
// sidecar, and the garbage collector took a fifth of the sidecars' CPU
// (bench/messaging, 64 KB ping-pong); reused, they cost nothing.
// Buffers below pooledMin are cheap to allocate and are not pooled.
const (
	pooledMin = 4 << 10
	pooledMax = 66 << 10 // 64 KiB and a request's names
)

var bufs = sync.Pool{New: func() any { b := make([]byte, pooledMax); return &b }}

// GetBuf returns a buffer of n bytes (its contents undefined): pooled
// when n is in the pooled range. Give it back with PutBuf once nothing
// refers to it any more, or leave it to the collector.
func GetBuf(n int) []byte {
	if n < pooledMin || n > pooledMax {
		return make([]byte, n)
	}
	return (*bufs.Get().(*[]byte))[:n]
}

// PutBuf takes back a buffer GetBuf returned (others are left alone).
func PutBuf(b []byte) {
	if cap(b) != pooledMax {
		return
	}
	b = b[:pooledMax]
	bufs.Put(&b)
}
