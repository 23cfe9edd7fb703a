package ziptrail

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// Messaging against real sidecars: queue-proxy-zl processes connected to
// the operator's control server (its directory resolves ranks; TokenReview
// on a real API server authenticates each sidecar as its pod), as in a
// cluster. Every pod is its own process, so a SIGKILL is a crashed pod.

// startPod runs a sidecar for pod in namespace ns, on the operator's
// directory (the namespace's keys come from the operator).
func startPod(t testing.TB, op *servers.Operator, ns, pod string, env ...string) *sidecar {
	t.Helper()
	return startSidecar(t, sidecarOpts{namespace: ns, env: append([]string{"SERVING_POD=" + pod,
		"ZIPTRAIL_OPERATOR_ADDR=" + op.Addr, "ZIPTRAIL_TOKEN_FILE=" + op.PodToken(t, ns, pod)}, env...)})
}

// viaSidecars keeps a pod's members on the sidecars' message streams
// (no direct TCP channels across nodes): the tests of that path.
const viaSidecars = "ZIPTRAIL_DIRECT_TCP=off"

// joinAll joins ranks concurrently (Join with WithWaitAll returns once
// every rank joined): ranks[i] runs in pods[i].
func joinAll(t testing.TB, ctx context.Context, pods []*sidecar, session, group string, size int, opts ...JoinOption) []*Group {
	t.Helper()
	groups := make([]*Group, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		wg.Go(func() {
			groups[r], errs[r] = pods[r%len(pods)].client.Join(ctx, session, group, r, size, append(opts, WithWaitAll())...)
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("join rank %d: %v", r, err)
		}
	}
	return groups
}

// eachMember runs f for every member concurrently and returns the errors.
func eachMember(groups []*Group, f func(g *Group) error) []error {
	errs := make([]error, len(groups))
	var wg sync.WaitGroup
	for i, g := range groups {
		wg.Go(func() { errs[i] = f(g) })
	}
	wg.Wait()
	return errs
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// TestGroupPointToPoint: two pods through their sidecars, small and 8
// MiB messages (the large ones through shared memory on both ends:
// mapped, not copied, on receipt), the order of one sender's messages
// kept, AnySource/AnyTag, membership views and Watch, Leave seen as
// PeerGone.
func TestGroupPointToPoint(t *testing.T) {
	op := servers.StartOperator(t)
	a, b := startPod(t, op, "ns", "pod-a", viaSidecars), startPod(t, op, "ns", "pod-b", viaSidecars)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	gs := joinAll(t, ctx, []*sidecar{a, b}, "s1", "p2p", 2)
	g0, g1 := gs[0], gs[1]
	if m, err := g1.Members(ctx); err != nil || !slices.Equal(m.Live, []int{0, 1}) || len(m.Gone) != 0 || m.Size != 2 {
		t.Fatalf("members: %+v, %v", m, err)
	}

	big1, big2 := randomBytes(8<<20), randomBytes(8<<20)
	msgs := [][]byte{[]byte("one"), big1, {}, []byte("four"), big2, randomBytes(5000)}
	for i, m := range msgs {
		if err := g0.Send(ctx, 1, int64(i%2), m); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	for i, want := range msgs {
		m, err := g1.Recv(ctx, AnySource, AnyTag)
		if err != nil {
			t.Fatalf("recv %d: %v", i, err)
		}
		if m.From != 0 || m.Tag != int64(i%2) || !bytes.Equal(m.Bytes(), want) || m.Size != int64(len(want)) {
			t.Fatalf("message %d: from %d tag %d, %d bytes; want tag %d, %d bytes", i, m.From, m.Tag, len(m.Bytes()), i%2, len(want))
		}
		if len(want) == 8<<20 && !m.Mapped() {
			t.Fatalf("message %d (8 MiB) was copied, not mapped", i)
		}
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if left := b.leftBeyondPool(t, 16); len(left) != 0 {
		t.Fatalf("the receiver left files in shared memory: %v", left)
	}

	// Tags select: a message of tag 5 is taken before an older one of tag 4.
	for _, tag := range []int64{4, 5} {
		if err := g1.Send(ctx, 0, tag, []byte(fmt.Sprint(tag))); err != nil {
			t.Fatal(err)
		}
	}
	for _, tag := range []int64{5, 4} {
		m, err := g0.Recv(ctx, 1, tag)
		if err != nil || string(m.Bytes()) != fmt.Sprint(tag) || m.Tag != tag {
			t.Fatalf("recv tag %d: %v %v", tag, m, err)
		}
	}

	// User receives and collectives do not see each other's messages: a
	// user message queued before a broadcast stays for the user receive.
	if err := g0.Send(ctx, 1, 9, []byte("user")); err != nil {
		t.Fatal(err)
	}
	errs := eachMember(gs, func(g *Group) error {
		m, err := g.Broadcast(ctx, 0, []byte("collective"))
		if err == nil && string(m.Bytes()) != "collective" {
			err = fmt.Errorf("broadcast got %q", m.Bytes())
		}
		return err
	})
	checkAll(t, "broadcast", errs)
	if m, err := g1.Recv(ctx, AnySource, AnyTag); err != nil || string(m.Bytes()) != "user" {
		t.Fatalf("user message after the broadcast: %v %v", m, err)
	}

	// A receive waits until ctx ends: ErrTimeout.
	short, stop := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := g1.Recv(short, 0, AnyTag)
	stop()
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("recv with nothing sent: %v, want ErrTimeout", err)
	}
	// Local argument checks.
	if err := g0.Send(ctx, 1, -3, nil); !errors.Is(err, ErrInvalid) {
		t.Fatalf("send with a negative tag: %v", err)
	}
	if _, err := g0.Recv(ctx, 2, AnyTag); !errors.Is(err, ErrInvalid) {
		t.Fatalf("recv from rank 2 of 2: %v", err)
	}
	// A taken rank, or another size, is a conflict.
	if _, err := a.client.Join(ctx, "s1", "p2p", 1, 2); !errors.Is(err, ErrConflict) {
		t.Fatalf("join a taken rank: %v, want ErrConflict", err)
	}
	if _, err := b.client.Join(ctx, "s1", "p2p", 0, 3); !errors.Is(err, ErrConflict) {
		t.Fatalf("join with another size: %v, want ErrConflict", err)
	}

	// Watch sees rank 1 leave; then a receive from it fails with PeerGone
	// naming it, and so does a send to it.
	before, err := g0.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	watched := make(chan *Members, 1)
	go func() {
		m, err := g0.Watch(ctx, before.Epoch)
		if err != nil {
			t.Error(err)
		}
		watched <- m
	}()
	if err := g1.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if err := g1.Leave(ctx); err != nil {
		t.Fatalf("leaving twice: %v", err)
	}
	m := <-watched
	if m == nil || m.Epoch <= before.Epoch || !slices.Equal(m.Live, []int{0}) || !slices.Equal(m.Gone, []int{1}) {
		t.Fatalf("watch after rank 1 left: %+v", m)
	}
	var pe *PeerError
	if _, err := g0.Recv(ctx, 1, AnyTag); !errors.Is(err, ErrPeerGone) || !errors.As(err, &pe) || pe.Rank != 1 {
		t.Fatalf("recv from the rank that left: %v, want PeerGone naming rank 1", err)
	}
	if err := g0.Send(ctx, 1, 0, []byte("late")); !errors.Is(err, ErrPeerGone) || !errors.As(err, &pe) || pe.Rank != 1 {
		t.Fatalf("send to the rank that left: %v, want PeerGone naming rank 1", err)
	}
	if _, err := g1.Recv(ctx, 0, AnyTag); !errors.Is(err, ErrClosed) {
		t.Fatalf("recv after leaving: %v, want ErrClosed", err)
	}
	if err := g0.Leave(ctx); err != nil {
		t.Fatal(err)
	}
}

// collectiveRound runs every collective once on every member and checks
// the results against a direct computation; big makes the data large
// (files in shared memory, the ring allreduce).
func collectiveRound(ctx context.Context, g *Group, round int, big bool) error {
	n, r := g.Size(), g.Rank()
	blob := func(i, size int) []byte { return payload(i+round*101, size) }
	size := 100
	if big {
		size = 8 << 20
	}
	if err := g.Barrier(ctx); err != nil {
		return fmt.Errorf("barrier: %w", err)
	}
	root := round % n
	m, err := g.Broadcast(ctx, root, blob(root, size))
	if err != nil {
		return fmt.Errorf("broadcast: %w", err)
	}
	ok := bytes.Equal(m.Bytes(), blob(root, size))
	m.Close()
	if !ok {
		return errors.New("broadcast: wrong data")
	}
	parts := make([][]byte, n)
	for i := range n {
		parts[i] = blob(i, size/n+i)
	}
	var scattered [][]byte
	if r == root {
		scattered = parts
	}
	m, err = g.Scatter(ctx, root, scattered)
	if err != nil {
		return fmt.Errorf("scatter: %w", err)
	}
	ok = bytes.Equal(m.Bytes(), parts[r])
	m.Close()
	if !ok {
		return errors.New("scatter: wrong part")
	}
	ms, err := g.Gather(ctx, (root+1)%n, parts[r])
	if err != nil {
		return fmt.Errorf("gather: %w", err)
	}
	for i, m := range ms {
		if !bytes.Equal(m.Bytes(), parts[i]) {
			return fmt.Errorf("gather: wrong part from %d", i)
		}
	}
	closeAll(ms)
	length := 1000
	if big {
		length = 1 << 17 // 1 MiB of float64: the ring
	}
	sum, err := Allreduce(ctx, g, contribution[float64](r, length), Sum)
	if err != nil {
		return fmt.Errorf("allreduce: %w", err)
	}
	if !slices.Equal(sum, direct(n, length, Sum[float64])) {
		return errors.New("allreduce: differs from the direct computation")
	}
	mx, err := Reduce(ctx, g, root, contribution[int64](r, length), Max)
	if err != nil {
		return fmt.Errorf("reduce: %w", err)
	}
	if r == root && !slices.Equal(mx, direct(n, length, Max[int64])) {
		return errors.New("reduce: differs from the direct computation")
	}
	joined, err := g.AllreduceBytes(ctx, []byte{byte(r)}, func(a, b []byte) ([]byte, error) {
		out := slices.Concat(a, b)
		slices.Sort(out)
		return out, nil
	})
	if err != nil {
		return fmt.Errorf("allreduce bytes: %w", err)
	}
	for i := range n {
		if joined[i] != byte(i) {
			return fmt.Errorf("allreduce bytes: %v", joined)
		}
	}
	a2a := make([][]byte, n)
	for j := range n {
		a2a[j] = blob(r*n+j, size/n)
	}
	ms, err = g.Alltoall(ctx, a2a)
	if err != nil {
		return fmt.Errorf("alltoall: %w", err)
	}
	for i, m := range ms {
		if !bytes.Equal(m.Bytes(), blob(i*n+r, size/n)) {
			return fmt.Errorf("alltoall: wrong part from %d", i)
		}
	}
	closeAll(ms)
	return nil
}

// transports are the two paths between members in different pods (as on
// different nodes): direct TCP channels between the functions (the
// default) and the sidecars' message streams (ZIPTRAIL_DIRECT_TCP=off).
var transports = []struct {
	name string
	env  []string
}{{"tcp", nil}, {"sidecars", []string{viaSidecars}}}

// pathsAre checks that every path the members decided to a rank in
// another pod is a TCP channel (tcp) or the sidecars (not tcp); ranks in
// one pod always use the sidecar. pod gives a rank's pod.
func pathsAre(t *testing.T, gs []*Group, tcp bool, pod func(rank int) int) {
	t.Helper()
	for _, g := range gs {
		g.att.omu.Lock()
		for to, oc := range g.att.out {
			if !oc.decided {
				continue
			}
			want := tcp && pod(to) != pod(g.rank)
			if got := oc.c != nil && oc.c.Stream(); got != want {
				t.Errorf("rank %d -> %d: a TCP channel %v, want %v", g.rank, to, got, want)
			}
		}
		g.att.omu.Unlock()
	}
}

// TestCollectivesOnSidecars: every collective with 4 members (one pod
// each) and with 8 members (4 pods with 2 members each), small and large
// data, several rounds in a row with changing roots, over TCP channels
// and over the sidecars.
func TestCollectivesOnSidecars(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			op := servers.StartOperator(t)
			var pods []*sidecar
			for i := range 4 {
				pods = append(pods, startPod(t, op, "ns", fmt.Sprintf("pod-%d", i), tr.env...))
			}
			for _, size := range []int{4, 8} {
				t.Run(fmt.Sprintf("%d members", size), func(t *testing.T) {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
					defer cancel()
					gs := joinAll(t, ctx, pods, "s-coll", fmt.Sprintf("g%d", size), size)
					errs := eachMember(gs, func(g *Group) error {
						for round := range 3 {
							if err := collectiveRound(ctx, g, round, round == 2); err != nil {
								return fmt.Errorf("round %d: %w", round, err)
							}
						}
						return nil
					})
					checkAll(t, fmt.Sprintf("%d members", size), errs)
					pathsAre(t, gs, tr.env == nil, func(r int) int { return r % len(pods) })
					for _, g := range gs {
						if err := g.Leave(ctx); err != nil {
							t.Fatal(err)
						}
					}
					for i, p := range pods {
						if left := p.leftBeyondPool(t, 16); len(left) != 0 {
							t.Fatalf("pod %d: files left in shared memory: %v", i, left)
						}
					}
				})
			}
		})
	}
}

// TestCollectivePeerGoneOnSidecars: the pod of two members is SIGKILLed
// while the group runs allreduces in a loop; every other member's
// collective ends with PeerGone naming one of the dead ranks, or a member
// that left after its own PeerGone (not a timeout: the members' contexts
// have no deadline that could end them). Over TCP channels and over the
// sidecars.
func TestCollectivePeerGoneOnSidecars(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) { testCollectivePeerGone(t, tr.env) })
	}
}

func testCollectivePeerGone(t *testing.T, env []string) {
	op := servers.StartOperator(t)
	var pods []*sidecar
	for i := range 4 {
		pods = append(pods, startPod(t, op, "ns", fmt.Sprintf("pod-%d", i), env...))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const size = 8
	gs := joinAll(t, ctx, pods, "s-kill", "g", size)
	victim := pods[2] // ranks 2 and 6
	dead := []int{2, 6}
	// The kill lands mid-collective: right after rank 0 finished its third
	// allreduce (the others are in the fourth or about to be).
	var rounds atomic.Int64
	third, killed := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(killed)
		<-third
		victim.kill()
	}()
	errs := eachMember(gs, func(g *Group) error {
		// A member whose collective failed returns, and its membership
		// ends, as a handler's invocation's end ends it. A member that had
		// finished the collective another gave up (a ring neighbour whose
		// last part had arrived) waits in the next one for that member: its
		// leaving is what ends that wait (without it, CI hung here).
		defer func() { _ = g.Leave(context.Background()) }()
		for i := 0; ; i++ {
			small := i%2 == 0
			n := 1 << 17 // ring
			if small {
				n = 16 // tree
			}
			if _, err := Allreduce(ctx, g, contribution[float64](g.Rank(), n), Sum); err != nil {
				return err
			}
			if g.Rank() == 0 && rounds.Add(1) == 3 {
				close(third)
			}
		}
	})
	<-killed
	// Each live member ends with PeerGone naming a dead rank, or a member
	// that left after its own PeerGone naming a dead rank (and so on).
	for r, err := range errs {
		if slices.Contains(dead, r) {
			continue // its pod is gone: whatever its process saw
		}
		named := r
		for range size {
			var pe *PeerError
			if err := errs[named]; !errors.Is(err, ErrPeerGone) || !errors.As(err, &pe) {
				t.Fatalf("rank %d: %v (through rank %d: %v), want PeerGone", r, err, named, errs[named])
			}
			if named = pe.Rank; slices.Contains(dead, named) {
				break
			}
		}
		if !slices.Contains(dead, named) {
			t.Fatalf("rank %d: %v: the ranks it names lead to no dead rank (2 or 6)", r, err)
		}
	}
}

// TestGroupForeignNamespace: the same session and group name in another
// namespace is another group. Its member takes a rank held in this
// namespace without a conflict, sees only its own namespace's members,
// and cannot reach a rank that exists only here: its send waits for that
// rank to join its own group (no mailbox) until its context ends, and the
// member here never receives it.
func TestGroupForeignNamespace(t *testing.T) {
	op := servers.StartOperator(t)
	a, b := startPod(t, op, "ns", "pod-a"), startPod(t, op, "ns", "pod-b")
	x := startPod(t, op, "other", "pod-x")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	gs := joinAll(t, ctx, []*sidecar{a, b}, "s1", "g", 2)
	gx, err := x.client.Join(ctx, "s1", "g", 1, 2) // rank 1 is b's in "ns"
	if err != nil {
		t.Fatalf("join in the other namespace: %v", err)
	}
	mx, err := gx.Members(ctx)
	if err != nil || !slices.Equal(mx.Live, []int{1}) || len(mx.Gone) != 0 {
		t.Fatalf("members seen from the other namespace: %+v, %v", mx, err)
	}
	short, stop := context.WithTimeout(ctx, 2*time.Second)
	err = gx.Send(short, 0, 0, []byte("from another namespace"))
	stop()
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("send to a rank of another namespace: %v, want ErrTimeout (it never joined this group)", err)
	}
	// Rank 0 gets its own namespace's rank 1's message, and only that.
	if err := gs[1].Send(ctx, 0, 0, []byte("from ns")); err != nil {
		t.Fatal(err)
	}
	m, err := gs[0].Recv(ctx, 1, AnyTag)
	if err != nil || string(m.Bytes()) != "from ns" {
		t.Fatalf("recv from rank 1: %v, %v", m, err)
	}
	short, stop = context.WithTimeout(ctx, 500*time.Millisecond)
	m, err = gs[0].Recv(short, AnySource, AnyTag)
	stop()
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("rank 0 received %v (%v), want nothing", m, err)
	}
	// Nor can the other namespace's member watch this group: its view is
	// its own group's.
	if m, err := gs[0].Members(ctx); err != nil || !slices.Equal(m.Live, []int{0, 1}) {
		t.Fatalf("members here: %+v, %v", m, err)
	}
}

// TestGroupJoinInHandler: a function joins with just (group, rank, size):
// the session and the invocation come from its envelope, and the
// membership ends when the invocation's request ends (no Leave), which the
// other member watches happen.
func TestGroupJoinInHandler(t *testing.T) {
	op := servers.StartOperator(t)
	shm := functionShm(t)
	fn := httptest.NewServer(FunctionHandler(func(ctx context.Context, inv *Invocation) ([]byte, error) {
		g, err := JoinGroup(ctx, "h", 1, 2, WithWaitAll())
		if err != nil {
			return nil, err
		}
		if g.Session() != inv.Session {
			return nil, fmt.Errorf("joined session %q, the invocation's is %q", g.Session(), inv.Session)
		}
		m, err := g.Recv(ctx, 0, 0)
		if err != nil {
			return nil, err
		}
		if err := g.Send(ctx, 0, 1, bytes.ToUpper(m.Bytes())); err != nil {
			return nil, err
		}
		return []byte("ok"), nil
	}))
	defer fn.Close()
	a := startPod(t, op, "ns", "pod-a")
	b := startSidecar(t, sidecarOpts{namespace: "ns", upstream: fn.URL, shm: shm, env: []string{"SERVING_POD=pod-b",
		"ZIPTRAIL_OPERATOR_ADDR=" + op.Addr, "ZIPTRAIL_TOKEN_FILE=" + op.PodToken(t, "ns", "pod-b")}})
	old := SetDefault(b.client) // the function's process talks to its pod's sidecar
	t.Cleanup(func() { SetDefault(old) })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	if _, err := JoinGroup(ctx, "h", 0, 2); !errors.Is(err, ErrInvalid) {
		t.Fatalf("JoinGroup outside a handler: %v, want ErrInvalid", err)
	}
	g0, err := a.client.Join(ctx, "sess-h", "h", 0, 2)
	if err != nil {
		t.Fatal(err)
	}
	type answer struct {
		code int
		body string
	}
	done := make(chan answer, 1)
	go func() {
		code, body := post(t, b.url(), invocation.Envelope{Namespace: "ns", Function: "fn", Session: "sess-h", Invocation: "inv-1"})
		done <- answer{code, body}
	}()
	sent := make(chan error, 1)
	go func() { sent <- g0.Send(ctx, 1, 0, []byte("ping")) }() // waits for rank 1 to join
	select {
	case err := <-sent:
		if err != nil {
			t.Fatal(err)
		}
	case ans := <-done:
		t.Fatalf("the invocation answered %d %q before it received", ans.code, ans.body)
	}
	m, err := g0.Recv(ctx, 1, 1)
	if err != nil || string(m.Bytes()) != "PING" {
		t.Fatalf("reply: %v %v", m, err)
	}
	if ans := <-done; ans.code != 200 || ans.body != "ok" {
		t.Fatalf("invocation answered %d %q", ans.code, ans.body)
	}
	// The invocation ended: its membership did too.
	var epoch uint64
	for {
		view, err := g0.Watch(ctx, epoch)
		if err != nil {
			t.Fatalf("watching for rank 1 to end: %v", err)
		}
		if slices.Equal(view.Gone, []int{1}) && slices.Equal(view.Live, []int{0}) {
			break
		}
		epoch = view.Epoch
	}
	if _, err := g0.Recv(ctx, 1, AnyTag); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("recv from the ended invocation's rank: %v, want PeerGone", err)
	}
}
