// Package samenode moves objects between pods on the same node without a
// TCP copy: the consumer's sidecar presents the sealed reference on the
// producer's unix socket and receives the object as a sealed memfd over
// SCM_RIGHTS, as Ray's plasma store hands out shared-memory segments.
// Across nodes (or whenever this path is not available) the TCP pull of
// package pull stays the data plane.
//
// # Where the socket lives
//
// Every queue-proxy-zl on a node shares one node directory, DefaultDir
// (/var/run/ziptrail/node), a hostPath volume that ziptrail's mutating
// admission webhook (internal/operator/podwebhook, served by the operator,
// registered by the chart) mounts into the queue-proxy container of
// Knative revision pods only, never into the user container. Each
// producer listens on <dir>/<pod UID>.sock. The webhook also gives
// queue-proxy its node name and pod UID (downward API environment
// variables EnvNode, EnvPodUID). Knative builds queue-proxy's container
// itself, so a webhook on the finished Pod is the one place it can get a
// volume; a CSI ephemeral volume would need a node plugin DaemonSet and a
// CSIDriver object for what a hostPath directory does (docs/samenode.md
// weighs both).
//
// # Trust
//
// The socket is no new door: it accepts exactly what the TCP data plane
// accepts, a reference sealed with the namespace's key (ref.Keyring: key,
// namespace, expiry; the object's own read count and expiry in the
// store), and one more guard the TCP path cannot have: the reference
// must name this producer (its data-plane address and pod UID, both
// sealed), so a reference for another pod whose object id happens to
// match is refused. On top, the peer's credentials (SO_PEERCRED) must be
// an allowed uid (default: this process's own, which every queue-proxy
// shares; the socket file is 0600), and the node directory is reachable
// only from queue-proxy containers. A consumer receives a memfd sealed
// with F_SEAL_WRITE|F_SEAL_SHRINK|F_SEAL_GROW|F_SEAL_SEAL: it can map and
// read the object, never change the producer's copy (or what other
// consumers of the same object read). The server never accepts file
// descriptors: any a client passes are closed at once and the connection
// dropped. Requests are single SOCK_SEQPACKET messages of at most
// MaxRequestBytes; a truncated or malformed one ends the connection.
//
// # Memory
//
// The store keeps objects as bytes in the producer's heap; the first
// same-node read of an object copies it once into a sealed memfd which
// the server keeps (Cached) while the store holds the object, so further
// reads (broadcast) are a descriptor handed over, no copy. Prepare does
// the copy at put time instead (bench/dataplane measures both).
package samenode

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// DefaultDir is the node directory (a hostPath) of the sockets.
	DefaultDir = "/var/run/ziptrail/node"
	// EnvDir, EnvNode, EnvPodUID: the environment variables the webhook
	// sets on queue-proxy (the directory, spec.nodeName, metadata.uid).
	EnvDir    = "ZIPTRAIL_NODE_DIR"
	EnvNode   = "ZIPTRAIL_NODE_NAME"
	EnvPodUID = "ZIPTRAIL_POD_UID"

	// MaxRequestBytes bounds one request (a reference is a few hundred bytes).
	MaxRequestBytes = 8 << 10
	// maxResponseBytes bounds a response's metadata or error text.
	maxResponseBytes = 8 << 10

	// RequiredSeals are the seals every object's memfd carries.
	RequiredSeals = unix.F_SEAL_WRITE | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
)

var magic = [4]byte{'Z', 'T', 'S', '1'}

// Status of a response.
const (
	statusOK       byte = 0
	statusRefused  byte = 1 // the reference: malformed, forged, foreign, expired, not this producer
	statusNotFound byte = 2 // the object: not here (spilled, gone), exhausted, expired
	statusBad      byte = 3 // the request itself
	statusInternal byte = 4
)

// Errors the client tells apart (errors.Is).
var (
	// ErrNotApplicable: the reference's producer is not on this node (or
	// did not offer the same-node path): pull over TCP.
	ErrNotApplicable = errors.New("samenode: producer not on this node")
	// ErrUnavailable: the producer's socket cannot be reached.
	ErrUnavailable = errors.New("samenode: producer socket unavailable")
	// ErrRefused: the producer refused the reference.
	ErrRefused = errors.New("samenode: reference refused by the producer")
	// ErrNotFound: the producer does not hold the object (spilled, read
	// as often as allowed, expired): the TCP pull knows the tiers.
	ErrNotFound = errors.New("samenode: object not held by the producer")
	// ErrProtocol: a malformed response or a descriptor that is not a
	// properly sealed memfd of the announced size.
	ErrProtocol = errors.New("samenode: protocol violation")
)

var uidRE = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// ValidPodUID reports whether uid looks like a Kubernetes UID (a UUID),
// the only names sockets get: nothing in it can leave the directory.
func ValidPodUID(uid string) bool { return uidRE.MatchString(uid) }

// SocketPath is the producer's socket in dir.
func SocketPath(dir, podUID string) (string, error) {
	if !ValidPodUID(podUID) {
		return "", fmt.Errorf("samenode: pod UID %q is not a UUID", podUID)
	}
	return filepath.Join(dir, podUID+".sock"), nil
}

// encodeRequest: magic | ref.
func encodeRequest(r string) []byte {
	return append(magic[:len(magic):len(magic)], r...)
}

// response: magic | status | size u64 | bucket len u16 | bucket | key len
// u16 | key, or for an error: magic | status | message.
type response struct {
	status      byte
	size        int64
	bucket, key string
	msg         string
}

func (r response) encode() []byte {
	b := append(magic[:len(magic):len(magic)], r.status)
	if r.status != statusOK {
		return append(b, truncate(r.msg, maxResponseBytes-len(b))...)
	}
	b = binary.BigEndian.AppendUint64(b, uint64(r.size))
	for _, s := range []string{truncate(r.bucket, 1024), truncate(r.key, 4096)} {
		b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
		b = append(b, s...)
	}
	return b
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

func decodeResponse(b []byte) (response, error) {
	if len(b) < 5 || !bytes.Equal(b[:4], magic[:]) {
		return response{}, fmt.Errorf("%w: bad response header", ErrProtocol)
	}
	r := response{status: b[4]}
	b = b[5:]
	if r.status != statusOK {
		r.msg = string(b)
		return r, nil
	}
	if len(b) < 8 {
		return response{}, fmt.Errorf("%w: short response", ErrProtocol)
	}
	size := binary.BigEndian.Uint64(b)
	if size > 1<<50 {
		return response{}, fmt.Errorf("%w: size %d", ErrProtocol, size)
	}
	r.size = int64(size)
	b = b[8:]
	for _, f := range []*string{&r.bucket, &r.key} {
		if len(b) < 2 || len(b)-2 < int(binary.BigEndian.Uint16(b)) {
			return response{}, fmt.Errorf("%w: short response", ErrProtocol)
		}
		n := int(binary.BigEndian.Uint16(b))
		*f = string(b[2 : 2+n])
		b = b[2+n:]
	}
	if len(b) != 0 {
		return response{}, fmt.Errorf("%w: trailing bytes", ErrProtocol)
	}
	return r, nil
}

// newSealedMemfd copies data into a new memfd and seals it read-only.
func newSealedMemfd(name string, data []byte) (*os.File, error) {
	fd, err := unix.MemfdCreate("ziptrail:"+truncate(name, 200), unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "memfd:"+name)
	if len(data) > 0 {
		// pwrite, not a mapping: a full memory cgroup fails the write
		// with an error rather than the writer with SIGBUS, and without
		// fallocate's zeroing pass (measured: fallocate+pwrite costs
		// twice pwrite alone).
		for off := 0; off < len(data); {
			n, err := unix.Pwrite(fd, data[off:], int64(off))
			if err != nil {
				_ = f.Close()
				return nil, fmt.Errorf("memfd write: %w", err)
			}
			off += n
		}
	}
	if err := AddSeals(fd, RequiredSeals); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("memfd seal: %w", err)
	}
	return f, nil
}

// sealAttempts is how many times AddSeals asks the kernel.
const sealAttempts = 5

// AddSeals adds seals to the memfd fd. Adding F_SEAL_WRITE fails with
// EBUSY while a page of the file has a reference other than the page
// cache's; the kernel waits about 150 ms for such references to go first
// (the page-cache batches of every CPU drained, then four waits). A page
// the kernel is migrating holds one for a moment, and under memory
// compaction on a loaded machine that can outlast the kernel's wait (seen
// once in CI, a sealed 6 MiB message's send failing). With no writable
// mapping of the file, EBUSY is such a transient reference: asked again,
// a little later each time. A writable shared mapping makes every attempt
// fail at once: EBUSY after sealAttempts.
func AddSeals(fd int, seals int) error {
	var err error
	for i := range sealAttempts {
		if i > 0 {
			time.Sleep(time.Duration(i) * 10 * time.Millisecond)
		}
		if _, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); !errors.Is(err, unix.EBUSY) {
			return err
		}
	}
	return err
}

// checkSealed verifies that fd is a memfd of size bytes carrying every
// RequiredSeals bit.
func checkSealed(fd int, size int64) error {
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return fmt.Errorf("%w: descriptor is not a sealable memfd: %v", ErrProtocol, err)
	}
	if seals&RequiredSeals != RequiredSeals {
		return fmt.Errorf("%w: memfd seals %#x lack %#x", ErrProtocol, seals, RequiredSeals&^seals)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("%w: fstat: %v", ErrProtocol, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != size {
		return fmt.Errorf("%w: memfd of %d bytes, announced %d", ErrProtocol, st.Size, size)
	}
	return nil
}
