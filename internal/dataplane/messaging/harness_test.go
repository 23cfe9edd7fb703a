package messaging

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ziptrail/ziptrail/internal/dataplane/pull"
	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// The tests of this package run pods' routers as the sidecar runs them:
// each behind a real data-plane port (pull.Server, which hands message
// streams to ServeStream), with a directory of their own (testDir) in
// place of the operator's, which answers joins and pushes views as the
// operator does.

// testDir is a directory for the test's pods.
type testDir struct {
	kr     *ref.Keyring
	mu     sync.Mutex
	pods   map[string]*Router // by data-plane address
	groups map[gkey]*dirGroup
}

type dirGroup struct {
	size    uint32
	epoch   uint64
	members map[uint32]string // rank -> data-plane address
	gone    []uint32
}

func newTestDir(t testing.TB) *testDir {
	t.Helper()
	kr, err := ref.NewKeyring("team-a", map[string][]byte{"k1": make([]byte, 32)}, "k1")
	if err != nil {
		t.Fatal(err)
	}
	return &testDir{kr: kr, pods: map[string]*Router{}, groups: map[gkey]*dirGroup{}}
}

// testPod is one pod's router behind its data-plane port.
type testPod struct {
	r       *Router
	addr    string
	accepts atomic.Int64 // connections its data-plane port accepted
}

// countingListener counts what it accepts.
type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

func (d *testDir) newPod(t testing.TB, opt func(*Config)) *testPod {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &testPod{addr: ln.Addr().String()}
	cfg := Config{Self: p.addr, Keys: func() *ref.Keyring { return d.kr }, Control: d.control(p.addr)}
	if opt != nil {
		opt(&cfg)
	}
	p.r = New(cfg)
	d.mu.Lock()
	d.pods[p.addr] = p.r
	d.mu.Unlock()
	srv := &pull.Server{Streams: p.r.ServeStream, StreamMagic: StreamMagic}
	go func() { _ = srv.Serve(countingListener{ln, &p.accepts}) }()
	t.Cleanup(func() {
		_ = srv.Close()
		p.r.streams.Close()
	})
	return p
}

// control is a pod's control stream to the directory.
func (d *testDir) control(addr string) func(*controlv1.SidecarMessage) error {
	return func(m *controlv1.SidecarMessage) error {
		go d.handle(addr, m)
		return nil
	}
}

func (d *testDir) handle(addr string, m *controlv1.SidecarMessage) {
	d.mu.Lock()
	var k gkey
	var joined *controlv1.GroupJoin
	switch x := m.Msg.(type) {
	case *controlv1.SidecarMessage_GroupJoin:
		joined = x.GroupJoin
		k = gkey{joined.Session, joined.Group}
		g := d.groups[k]
		if g == nil {
			g = &dirGroup{size: joined.Size, members: map[uint32]string{}}
			d.groups[k] = g
		}
		g.members[joined.Rank] = addr
	case *controlv1.SidecarMessage_GroupLeave:
		k = gkey{x.GroupLeave.Session, x.GroupLeave.Group}
		g := d.groups[k]
		if g == nil || g.members[x.GroupLeave.Rank] != addr {
			d.mu.Unlock()
			return
		}
		delete(g.members, x.GroupLeave.Rank)
		g.gone = append(g.gone, x.GroupLeave.Rank)
	default:
		d.mu.Unlock()
		return
	}
	g := d.groups[k]
	g.epoch++
	v := &controlv1.GroupView{Session: k.session, Group: k.group, Size: g.size, Epoch: g.epoch, Gone: append([]uint32(nil), g.gone...)}
	to := map[*Router]bool{}
	for rank, a := range g.members {
		v.Members = append(v.Members, &controlv1.GroupMember{Rank: rank, DataplaneAddr: a, Pod: a})
		to[d.pods[a]] = true
	}
	self := d.pods[addr]
	to[self] = true
	d.mu.Unlock()
	if joined != nil {
		self.JoinResult(&controlv1.GroupJoinResult{JoinId: joined.JoinId})
	}
	for r := range to {
		r.View(v)
	}
}

func (p *testPod) join(t testing.TB, rank, size uint32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := p.r.Join(ctx, "s1", "g", rank, size, false, "", false); err != nil {
		t.Fatalf("join as rank %d: %v", rank, err)
	}
}

// waitJoined waits until p's view of the group lists every rank.
func (p *testPod) waitJoined(t testing.TB, size uint32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for after := uint64(0); ; {
		v, err := p.r.Members(ctx, "s1", "g", after)
		if err != nil || ctx.Err() != nil {
			t.Fatalf("waiting for the group's view: %v", err)
		}
		if uint32(len(v.Members)) == size {
			return
		}
		after = v.Epoch
	}
}

// auth is the group's authenticator, as p's deliveries carry it.
func (p *testPod) auth(t testing.TB) string {
	t.Helper()
	a, err := p.r.authenticator(gkey{"s1", "g"})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// inboxBytes is what rank's inbox in p holds.
func (p *testPod) inboxBytes(rank uint32) int64 {
	p.r.mu.Lock()
	defer p.r.mu.Unlock()
	if g := p.r.groups[gkey{"s1", "g"}]; g != nil && g.local[rank] != nil {
		return g.local[rank].bytes
	}
	return 0
}

// blackhole is a TCP address whose dials hang: a listener with a backlog
// of one that never accepts, its queue filled, so the kernel drops
// further SYNs (and the dialer retransmits them) until the dial's
// context ends.
func blackhole(t testing.TB) (addr string, port int) {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	port = sa.(*syscall.SockaddrInet4).Port
	addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for range 8 { // fill the accept queue
		c, err := net.DialTimeout("tcp", addr, 300*time.Millisecond)
		if err != nil {
			break
		}
		t.Cleanup(func() { c.Close() })
	}
	return addr, port
}

// synSent counts this host's TCP sockets dialing port whose SYN has not
// been answered (/proc/net/tcp, state SYN_SENT).
func synSent(t testing.TB, port int) int {
	t.Helper()
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		t.Skipf("no /proc/net/tcp: %v", err)
	}
	defer f.Close()
	want := fmt.Sprintf(":%04X", port)
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) > 3 && strings.HasSuffix(fs[2], want) && fs[3] == "02" {
			n++
		}
	}
	return n
}

// metric is the value of a counter or gauge of the default registry
// (summed over its labels matching label=value; label "" takes all).
func metric(t testing.TB, name, label, value string) float64 {
	t.Helper()
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			ok := label == ""
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					ok = true
				}
			}
			if !ok {
				continue
			}
			if c := m.GetCounter(); c != nil {
				sum += c.GetValue()
			}
			if g := m.GetGauge(); g != nil {
				sum += g.GetValue()
			}
		}
	}
	return sum
}
