// Package ref seals and opens object references: opaque strings that tell a
// consumer's sidecar where to pull an object from, without user code ever
// seeing an address. A reference is "zt1." + base64url(keyID || nonce ||
// AES-256-GCM(record)), the record holding the producer's data-plane
// address, the object key, the namespace, the expiry and the reads allowed.
// The key id selects one of the namespace's keys, so keys can rotate.
//
// A producer that serves the same-node path (internal/dataplane/samenode)
// also seals its node's name and its pod's UID: a consumer on that node
// then asks the producer's unix socket (named by the UID) for a sealed
// memfd instead of pulling over TCP. Sealed, so a function cannot point a
// consumer at another pod's socket. The two fields follow the fixed part
// of the record only when set, so a record without them encodes exactly
// as before and older references still open; a sidecar built before
// these fields refuses a reference carrying them (ErrMalformed), which is
// why only producers with the node directory set them.
package ref

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Prefix marks version 1 references.
const Prefix = "zt1."

// Record is what a reference carries.
type Record struct {
	Addr      string    // producer sidecar's data-plane address, host:port
	Key       string    // object id in the producer's store
	Namespace string    // references open only in their namespace
	Expires   time.Time // after this the reference is refused
	Reads     uint32    // reads the object allows
	// Node and Pod: the producer's node name and pod UID, set when the
	// producer serves the same-node path; empty otherwise.
	Node, Pod string
}

// Errors, one per class of bad reference, so callers and users can tell
// them apart. Match with errors.Is.
var (
	ErrMalformed  = errors.New("malformed reference")
	ErrUnknownKey = errors.New("reference sealed with an unknown key")
	ErrTampered   = errors.New("reference fails authentication (tampered or forged)")
	ErrExpired    = errors.New("reference expired")
	ErrForeign    = errors.New("reference belongs to another namespace")
)

// Keyring holds a namespace's keys by id; Active seals new references.
type Keyring struct {
	mu     sync.RWMutex
	ns     string
	active string
	aeads  map[string]cipher.AEAD
}

// NewKeyring returns a keyring for namespace with the given keys (id -> 32
// byte secret) and active key id.
func NewKeyring(namespace string, keys map[string][]byte, active string) (*Keyring, error) {
	k := &Keyring{ns: namespace}
	return k, k.Set(keys, active)
}

// Set replaces the keys (rotation: keep old ids that may still be in use).
func (k *Keyring) Set(keys map[string][]byte, active string) error {
	aeads := map[string]cipher.AEAD{}
	for id, secret := range keys {
		if len(id) == 0 || len(id) > 255 {
			return fmt.Errorf("ref: key id %q must be 1-255 bytes", id)
		}
		if len(secret) != 32 {
			return fmt.Errorf("ref: key %s is %d bytes, want 32 (AES-256)", id, len(secret))
		}
		block, err := aes.NewCipher(secret)
		if err != nil {
			return err
		}
		if aeads[id], err = cipher.NewGCM(block); err != nil {
			return err
		}
	}
	if _, ok := aeads[active]; !ok {
		return fmt.Errorf("ref: active key %q is not among the keys", active)
	}
	k.mu.Lock()
	k.aeads, k.active = aeads, active
	k.mu.Unlock()
	return nil
}

// Namespace is the keyring's namespace.
func (k *Keyring) Namespace() string { return k.ns }

// Seal makes a reference for r with the active key. The record's namespace
// is the keyring's.
func (k *Keyring) Seal(r Record) (string, error) {
	k.mu.RLock()
	id, aead := k.active, k.aeads[k.active]
	k.mu.RUnlock()
	r.Namespace = k.ns
	plain := encode(r)
	buf := make([]byte, 0, 1+len(id)+aead.NonceSize()+len(plain)+aead.Overhead())
	buf = append(buf, byte(len(id)))
	buf = append(buf, id...)
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return "", err
	}
	buf = append(buf, nonce...)
	// The key id is authenticated as additional data.
	buf = aead.Seal(buf, nonce, plain, buf[:1+len(id)])
	return Prefix + base64.RawURLEncoding.EncodeToString(buf), nil
}

// Open authenticates and decodes a reference, refusing expired and foreign ones.
func (k *Keyring) Open(s string, now time.Time) (Record, error) {
	r, err := k.OpenExpired(s)
	if err != nil {
		return Record{}, err
	}
	if !now.Before(r.Expires) {
		return Record{}, fmt.Errorf("%w at %s", ErrExpired, r.Expires.UTC().Format(time.RFC3339))
	}
	return r, nil
}

// OpenExpired authenticates and decodes a reference of this namespace like
// Open, but does not refuse it once its sealed expiry has passed. The
// sealed expiry is the object's TTL at the time it was produced; a
// keep-alive (Store.Extend, through the producer) may have kept the object
// longer, and only its producer knows. So the data plane asks the producer
// with an expired reference, and the producer honours it only while its
// store still holds the object unexpired (pull.Server).
func (k *Keyring) OpenExpired(s string) (Record, error) {
	if !strings.HasPrefix(s, Prefix) {
		return Record{}, fmt.Errorf("%w: missing %q prefix", ErrMalformed, Prefix)
	}
	raw, err := base64.RawURLEncoding.DecodeString(s[len(Prefix):])
	if err != nil {
		return Record{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if len(raw) < 1 || len(raw) < 1+int(raw[0]) {
		return Record{}, fmt.Errorf("%w: truncated", ErrMalformed)
	}
	idLen := int(raw[0])
	id := string(raw[1 : 1+idLen])
	k.mu.RLock()
	aead, ok := k.aeads[id]
	k.mu.RUnlock()
	if !ok {
		return Record{}, fmt.Errorf("%w %q (namespace %s)", ErrUnknownKey, id, k.ns)
	}
	rest := raw[1+idLen:]
	if len(rest) < aead.NonceSize()+aead.Overhead() {
		return Record{}, fmt.Errorf("%w: truncated", ErrMalformed)
	}
	nonce, sealed := rest[:aead.NonceSize()], rest[aead.NonceSize():]
	plain, err := aead.Open(nil, nonce, sealed, raw[:1+idLen])
	if err != nil {
		return Record{}, ErrTampered
	}
	r, err := decode(plain)
	if err != nil {
		return Record{}, err
	}
	if r.Namespace != k.ns {
		return Record{}, fmt.Errorf("%w: sealed for %s, opened in %s", ErrForeign, r.Namespace, k.ns)
	}
	return r, nil
}

// encode is a compact binary form: varint-length strings, fixed ints.
func encode(r Record) []byte {
	b := make([]byte, 0, 32+len(r.Addr)+len(r.Key)+len(r.Namespace))
	for _, s := range []string{r.Addr, r.Key, r.Namespace} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	b = binary.BigEndian.AppendUint64(b, uint64(r.Expires.UnixNano()))
	b = binary.BigEndian.AppendUint32(b, r.Reads)
	if r.Node != "" || r.Pod != "" {
		// The same-node extension, only when set (see the package doc).
		for _, s := range []string{r.Node, r.Pod} {
			b = binary.AppendUvarint(b, uint64(len(s)))
			b = append(b, s...)
		}
	}
	return b
}

func decode(b []byte) (Record, error) {
	var r Record
	fields := []*string{&r.Addr, &r.Key, &r.Namespace}
	for _, f := range fields {
		n, used := binary.Uvarint(b)
		if used <= 0 || uint64(len(b)-used) < n {
			return Record{}, fmt.Errorf("%w: bad record", ErrMalformed)
		}
		*f = string(b[used : used+int(n)])
		b = b[used+int(n):]
	}
	if len(b) < 12 {
		return Record{}, fmt.Errorf("%w: bad record", ErrMalformed)
	}
	r.Expires = time.Unix(0, int64(binary.BigEndian.Uint64(b)))
	r.Reads = binary.BigEndian.Uint32(b[8:])
	if b = b[12:]; len(b) == 0 {
		return r, nil
	}
	for _, f := range []*string{&r.Node, &r.Pod} {
		n, used := binary.Uvarint(b)
		if used <= 0 || uint64(len(b)-used) < n {
			return Record{}, fmt.Errorf("%w: bad record", ErrMalformed)
		}
		*f = string(b[used : used+int(n)])
		b = b[used+int(n):]
	}
	if len(b) != 0 {
		return Record{}, fmt.Errorf("%w: bad record", ErrMalformed)
	}
	return r, nil
}
