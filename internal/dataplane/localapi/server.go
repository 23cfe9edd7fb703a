// Package localapi is the sidecar's API for the function container: gRPC
// over a unix socket for control, files in the pod's shared-memory
// directory for object bytes (see proto/ziptrail/sidecar/v1). It offers
// Zipline's put/get/invoke and Pheromone's send_object/get_object on top of
// the pod's object store, the data-plane client and the storage tiers.
package localapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/ziptrail/ziptrail/internal/dataplane/localapi/sidecarv1"
	"github.com/ziptrail/ziptrail/internal/dataplane/messaging"
	"github.com/ziptrail/ziptrail/internal/dataplane/pull"
	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
	"github.com/ziptrail/ziptrail/internal/dataplane/tier"
	"github.com/ziptrail/ziptrail/internal/recovery"
)

// Server implements the local API for one pod.
type Server struct {
	sidecarv1.UnimplementedSidecarServer

	Store *store.Store
	// KeySource gives the namespace's keyring once the sidecar has it;
	// nil: none (the calls that need it fail as not ready).
	KeySource KeySource
	// Puller fetches referenced objects; nil: none.
	Puller Puller
	// Spilled reads this pod's objects that spilled to the fast tier; nil
	// when no tier is configured.
	Spilled pull.Fallback
	// Persist is the slow tier for persist=true objects and shuffle
	// storage (TierPut); nil disables it.
	Persist tier.Tier
	// Fast is the fast tier for shuffle storage (TierPut); nil disables it.
	Fast tier.Tier
	// Messages is the pod's messaging router (docs/messaging.md); nil
	// refuses the messaging calls.
	Messages *messaging.Router
	// Reporter sends object-ready events to the operator; nil without one.
	Reporter Reporter

	Addr string // this pod's data-plane address, sealed into references
	// Sealer adds what the sidecar seals into every reference it makes
	// besides the address; nil adds nothing.
	Sealer          Sealer
	Dir             string // shared-memory directory for object files
	Namespace       string
	Function        string
	TTL             time.Duration // default object lifetime
	InlineThreshold int           // objects up to this size are returned inline
	PutTimeout      time.Duration // how long a put waits for memory; default 30 s
	MaxObjectBytes  int64         // the store's cap; larger payload files are refused unread
	// FilePoolBytes bounds the idle object files kept for reuse
	// (filepool.go); default a quarter of Dir's volume, at least 64 MiB.
	FilePoolBytes int64
	HTTP          *http.Client // for Invoke; default: no timeout beyond the request's
	Now           func() time.Time
	// SameNodeGet, when set, answers the object socket's gets of objects
	// a producer on this node holds with their sealed memfd (objsock.go);
	// nil: those gets use the gRPC Get.
	SameNodeGet SameNodeGetter
	// Adopter, when set, is given a duplicate of every memfd a function
	// put through the object socket (samenode.Server).
	Adopter Adopter
	// ReleaseTaken, when set (tests), is called with the tokens of each
	// release a lending member channel sent (op opRelease) once the pool
	// took them back. A release has no answer: a message that arrives
	// before this may not reuse the files it names.
	ReleaseTaken func(tokens []string)

	seq       atomic.Uint64
	initOnce  sync.Once
	poolOnce  sync.Once
	pool      *filePool
	retOnce   sync.Once
	returns   *returns
	adoptOnce sync.Once
	adopted   *adopted            // memfds put through the object socket (objsock.go)
	inflight  *semaphore.Weighted // payload bytes read but not yet stored
	mu        sync.Mutex
	byName    map[string]string // session/bucket/key -> store id, objects sent here
	sent      sentOutputs       // objects sent per invocation, for its response
	grpcSrv   *grpc.Server
	objLn     net.Listener // the object socket (objsock.go)
	objConns  map[*net.UnixConn]struct{}
	stopped   bool
}

// Listen opens the API's unix socket, replacing a stale one.
func Listen(socket string) (net.Listener, error) {
	_ = os.Remove(socket)
	ln, err := net.Listen("unix", socket)
	if err != nil {
		return nil, fmt.Errorf("local API socket: %w", err)
	}
	// The function container may run as another user.
	if err := os.Chmod(socket, 0o666); err != nil {
		_ = ln.Close()
		return nil, err
	}
	return ln, nil
}

// Serve answers calls on ln until Stop.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	s.grpcSrv = grpc.NewServer(grpc.ChainUnaryInterceptor(recovery.UnaryInterceptor("queue-proxy-zl"), observe),
		grpc.ChainStreamInterceptor(recovery.StreamInterceptor("queue-proxy-zl")))
	sidecarv1.RegisterSidecarServer(s.grpcSrv, s)
	srv := s.grpcSrv
	s.mu.Unlock()
	return srv.Serve(ln)
}

// Stop ends Serve, letting running calls finish.
func (s *Server) Stop() {
	s.mu.Lock()
	srv, objLn := s.grpcSrv, s.objLn
	s.stopped = true
	for c := range s.objConns {
		_ = c.Close()
	}
	s.mu.Unlock()
	if objLn != nil {
		_ = objLn.Close()
	}
	if srv != nil {
		srv.GracefulStop()
	}
	s.files(context.Background()).stop()
	s.returned().stop()
}

func (s *Server) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func (s *Server) ttl(ms int64) time.Duration {
	if ms > 0 {
		return time.Duration(ms) * time.Millisecond
	}
	if s.TTL > 0 {
		return s.TTL
	}
	return 10 * time.Minute
}

func (s *Server) keys(ctx context.Context) (*ref.Keyring, error) {
	if s.KeySource == nil {
		return nil, errNotReady
	}
	kr, err := s.KeySource.Keys(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errNotReady, err)
	}
	return kr, nil
}

// limit bounds a payload file to what the store could ever hold, so an
// oversized file is refused before it is read into memory.
func (s *Server) limit() int64 {
	if s.MaxObjectBytes > 0 {
		return s.MaxObjectBytes
	}
	return math.MaxInt64
}

func (s *Server) newID(kind string) string {
	return kind + "-" + strconv.FormatUint(s.seq.Add(1), 10)
}

// Put implements Zipline's put(obj, N).
func (s *Server) Put(ctx context.Context, req *sidecarv1.PutRequest) (*sidecarv1.PutResponse, error) {
	returnTo := returnsFor(ctx)
	obj, release, err := s.loadObject(ctx, req.GetObject(), returnTo)
	if err != nil {
		return nil, toStatus(s.putError(store.Meta{}, -1, err))
	}
	defer release()
	if returnTo != "" {
		if names := s.returned().take(returnTo); len(names) > 0 {
			_ = grpc.SetHeader(ctx, metadata.Pairs(returnedKey, joinNames(names)))
		}
	}
	reads := req.GetReads()
	if reads == 0 {
		reads = 1
	}
	m := store.Meta{ID: s.newID("put"), Session: req.GetSession(), Reads: reads, Expires: s.now().Add(s.ttl(req.GetTtlMs()))}
	r, err := s.put(ctx, m, obj)
	if err != nil {
		return nil, toStatus(err)
	}
	return &sidecarv1.PutResponse{Ref: r, Size: int64(len(obj.data))}, nil
}

// Get implements Zipline's get(ref): from this pod's store when the object
// is local, else pulled from its producer.
func (s *Server) Get(ctx context.Context, req *sidecarv1.GetRequest) (*sidecarv1.GetResponse, error) {
	s.files(ctx) // takes back the files the caller released, whatever comes next
	kr, err := s.keys(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	rec, err := kr.Open(req.GetRef(), s.now())
	if err != nil {
		return nil, toStatus(err)
	}
	if rec.Addr == s.Addr {
		resp, err := s.readLocal(ctx, rec.Key)
		return resp, toStatus(err)
	}
	payload, size, err := s.fetch(ctx, req.GetRef())
	if err != nil {
		return nil, toStatus(err)
	}
	return &sidecarv1.GetResponse{Object: payload, Size: size, Source: "remote"}, nil
}

// fetch pulls a referenced object from its producer: inline when small,
// else into a file of the object directory (a reused one when there is
// one, see filepool.go), lent to the caller when it asked.
func (s *Server) fetch(ctx context.Context, r string) (*sidecarv1.Payload, int64, error) {
	if s.Puller == nil {
		return nil, 0, errNotReady
	}
	files := s.files(ctx)
	var (
		buf []byte
		pf  *poolFile
	)
	info, err := s.Puller.PullTo(ctx, r, func(size int64) (io.WriterAt, error) {
		if pf != nil { // the producer broke off and a tier has it: start over
			pf.drop()
			pf = nil
		}
		if size <= int64(s.InlineThreshold) {
			buf = inlineBuffer(ctx, int(size), "remote")
			return pull.Buffer(buf), nil
		}
		var err error
		if pf, err = files.take(size); err != nil {
			return nil, err
		}
		return &pull.Mapping{File: pf.f, Mem: pf.mem}, nil
	})
	if err != nil {
		if pf != nil {
			pf.drop() // a failed get leaves nothing in the directory
		}
		return nil, 0, err
	}
	if pf != nil {
		return s.handOut(ctx, files, pf), info.Size, nil
	}
	return inlinePayload(buf), info.Size, nil
}

// files returns the pool of reusable object files, first taking back the
// files the caller released (request metadata releaseKey).
func (s *Server) files(ctx context.Context) *filePool {
	s.poolOnce.Do(func() { s.pool = newFilePool(s.Dir, s.FilePoolBytes) })
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		for _, v := range md.Get(releaseKey) {
			s.pool.release(strings.Split(v, ","))
		}
	}
	if slot := lendingSlot(ctx); slot != nil && len(slot.released) > 0 {
		s.pool.release(slot.released)
		slot.released = nil
	}
	return s.pool
}

// returned is the list of put files waiting for their clients.
func (s *Server) returned() *returns {
	s.retOnce.Do(func() { s.returns = &returns{dir: s.Dir, maps: &parkedMaps{}} })
	return s.returns
}

// returnsFor is the id of a client that takes its put files back (request
// metadata lendKey and clientKey), or "".
func returnsFor(ctx context.Context) string {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok || !slices.Contains(md.Get(lendKey), lendValue) {
		return ""
	}
	if id := md.Get(clientKey); len(id) == 1 && validClientID(id[0]) {
		return id[0]
	}
	return ""
}

// handOut returns a filled file to the caller: lent (and named in the
// response header lentKey) when its request asked, else its own.
func (s *Server) handOut(ctx context.Context, files *filePool, pf *poolFile) *sidecarv1.Payload {
	if slot := lendingSlot(ctx); slot != nil { // the object socket's get
		path, token := files.handOut(pf, true)
		slot.token = token
		return pathPayload(path)
	}
	lend := false
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		lend = slices.Contains(md.Get(lendKey), lendValue)
	}
	if lend && grpc.ServerTransportStreamFromContext(ctx) == nil {
		lend = false // not a gRPC call: no header to say it is lent
	}
	path, token := files.handOut(pf, lend)
	if token != "" {
		_ = grpc.SetHeader(ctx, metadata.Pairs(lentKey, token))
	}
	return pathPayload(path)
}

// readLocal serves an object of this pod: from memory, else from the
// fast tier it spilled to.
func (s *Server) readLocal(ctx context.Context, id string) (*sidecarv1.GetResponse, error) {
	lease, err := s.Store.Read(id)
	if err == nil {
		defer lease.Release()
		return s.respond(ctx, lease.Data, "local")
	}
	if !errors.Is(err, store.ErrNotFound) || s.Spilled == nil {
		return nil, err
	}
	data, from, terr := s.Spilled.Get(ctx, id)
	if terr != nil {
		return nil, fmt.Errorf("%w (and %v)", err, terr)
	}
	return s.respond(ctx, data, from)
}

// respond returns data inline when small, else in a file of the object
// directory (written with pwrite: data may be a mapped file a function
// can truncate, which then fails this call instead of faulting).
func (s *Server) respond(ctx context.Context, data []byte, source string) (*sidecarv1.GetResponse, error) {
	if len(data) <= s.InlineThreshold {
		buf := inlineBuffer(ctx, len(data), source)
		copy(buf, data)
		return &sidecarv1.GetResponse{Object: inlinePayload(buf), Size: int64(len(data)), Source: source}, nil
	}
	files := s.files(ctx)
	pf, err := files.take(int64(len(data)))
	if err != nil {
		return nil, err
	}
	if _, err := pf.f.WriteAt(data, 0); err != nil {
		pf.drop()
		return nil, err
	}
	return &sidecarv1.GetResponse{Object: s.handOut(ctx, files, pf), Size: int64(len(data)), Source: source}, nil
}

func inlinePayload(b []byte) *sidecarv1.Payload {
	return &sidecarv1.Payload{Source: &sidecarv1.Payload_Inline{Inline: b}}
}

func pathPayload(p string) *sidecarv1.Payload {
	return &sidecarv1.Payload{Source: &sidecarv1.Payload_Path{Path: p}}
}
