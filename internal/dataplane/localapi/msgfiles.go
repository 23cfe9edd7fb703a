package localapi

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ziptrail/ziptrail/internal/dataplane/messaging"
)

// Large messages reuse files too (docs/messaging.md, "Reused files"). A
// new file of the object directory costs a page allocation, a zeroing
// and a fault per 4 KiB page, and as much again to free it: measured on
// our 2-core VM, a new 1 MiB file written, mapped and removed took
// 1.1–1.4 ms against 0.1–0.2 ms for the same file filled again. A large
// message used to pay that twice, its sender's file and its receiver's.
//
//   - Receiver: the sidecar reads an incoming message into a file of the
//     pool (filepool.go). A function whose member channel asked for it
//     (attach flag flagLendFiles) gets the file lent: it sends the token
//     back on the same connection (op opRelease) once it closed the
//     message, and the sidecar fills the file again for a later message.
//     Any other receiver gets the file as before (the name is its own).
//   - Sender: a send that asks for it (send flag flagReturnFile) gets its
//     file back once it was streamed (response flag flagReturned), to
//     write its next message into (clientfiles.go's put files).

const (
	// opRelease (function → sidecar, on a member channel that lends):
	// payload = release tokens, comma-separated. No response.
	opRelease = 5
	// flagLendFiles (attach request): the member releases lent files.
	flagLendFiles = 4
	// flagLent (pushed message with a file): the body is the path, a NUL
	// and the release token.
	flagLent = 8
	// flagReturnFile (send request with a file): give the file back.
	flagReturnFile = 2
	// flagReturned (send response): the file is the client's again.
	flagReturned = 4
	// maxReleaseBytes bounds one release request.
	maxReleaseBytes = 64 << 10
)

// MessageFile returns a file of size bytes for a large incoming message
// (messaging.Config.NewFile): a reused one when the pool has one.
func (s *Server) MessageFile(size int64) (messaging.File, error) {
	p := s.files(context.Background())
	pf, err := p.take(size)
	if err != nil {
		return nil, err
	}
	return &msgFile{pool: p, dir: p.dir, pf: pf}, nil
}

// NewMessageFile returns a new file of size bytes in dir for a large
// incoming message, not reused (no pool: before the local API runs).
func NewMessageFile(dir string, size int64) (messaging.File, error) {
	pf, err := (&filePool{dir: dir}).create(size)
	if err != nil {
		return nil, err
	}
	return &msgFile{dir: dir, pf: pf}, nil
}

// msgFile is a file that holds a large incoming message, until a
// function takes it (HandOut) or nobody will (Discard): a file of the
// pool, or with pool nil one that is never reused.
type msgFile struct {
	pool *filePool
	dir  string
	pf   *poolFile
}

func (m *msgFile) Path() string { return filepath.Join(m.dir, m.pf.name) }
func (m *msgFile) Mem() []byte  { return m.pf.mem }

func (m *msgFile) HandOut(lent bool) string {
	if m.pool == nil {
		m.pf.unmap()
		return ""
	}
	if lent && !m.pool.canLend() {
		// Lent files are bounded; lending this one would forget an older
		// one. The function gets it as its own instead.
		lent = false
	}
	if !lent {
		m.pool.forget(m.pf) // an earlier lending of it ends: the name is the function's
	}
	_, token := m.pool.handOut(m.pf, lent)
	return token
}

func (m *msgFile) Discard() {
	if m.pool != nil {
		m.pool.forget(m.pf)
	}
	m.pf.drop()
}

// MessagePayload prepares a message's bytes for SendFile: small ones
// inline, large ones written into a file of this client's that a send or
// a put gave back (its pages already there), else a new one. name is the
// file's base name, for MessageSent.
func (c *Client) MessagePayload(data []byte) (inline []byte, path, name string, err error) {
	p, name, err := c.putPayload(data)
	if err != nil {
		return nil, "", "", err
	}
	return p.GetInline(), p.GetPath(), name, nil
}

// MessageFile writes parts into a file of size bytes for SendFile, as
// MessagePayload does with a large message (a reused file when there is
// one); every part must lie within size.
func (c *Client) MessageFile(size int64, parts ...Part) (path, name string, err error) {
	for _, p := range parts {
		if p.Off < 0 || p.Off+int64(len(p.Data)) > size {
			return "", "", fmt.Errorf("a part of %d bytes at %d outside a %d-byte file", len(p.Data), p.Off, size)
		}
	}
	p, name, err := c.filePayload(size, parts...)
	if err != nil {
		return "", "", err
	}
	return p.GetPath(), name, nil
}

// MessageSent ends the send of a MessagePayload file: returned, the file
// is this client's again, for its next message or put; otherwise it is
// forgotten and removed (the sidecar removes it too).
func (c *Client) MessageSent(name string, returned bool) {
	if returned {
		c.takeBack([]string{name})
		return
	}
	c.mu.Lock()
	pf, ok := c.putLent[name]
	delete(c.putLent, name)
	c.mu.Unlock()
	if ok {
		pf.unmap()
	}
	_ = os.Remove(filepath.Join(c.Dir, name))
}
