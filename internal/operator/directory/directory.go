// Package directory is the operator's list of live messaging-group
// members (Pikachu's directory, docs/messaging.md): which pod runs which
// rank of which group. Sidecars join and leave ranks over their control
// streams; every change bumps the group's epoch and is pushed to every pod
// with a member, and to the pod whose member just left, so members see a
// change as soon as the operator does. A stream that ends (its pod died:
// SIGKILL, deleted, scaled away) takes its pod's members with it after a
// short grace in which a pod that is alive reconnects and keeps them.
//
// Groups are scoped by namespace: the namespace is the stream's verified
// one, so a rank resolves only within its namespace. The package has no
// Kubernetes or network imports; internal/operator/control wires it to the streams.
package directory

import (
	"errors"
	"fmt"
	"slices"
	"sync"
)

// Key names a group.
type Key struct{ Namespace, Session, Group string }

func (k Key) String() string { return k.Namespace + "/" + k.Session + "/" + k.Group }

// Member is a rank's pod. Stream identifies the control stream (the pod)
// that joined it.
type Member struct {
	Rank            uint32
	Stream          uint64
	Addr, Pod, Node string
	// suspect: its stream ended; it is announced gone when the grace
	// ends, unless its pod joins the rank again first (a reconnect).
	suspect bool
}

// View is a group's membership at one epoch.
type View struct {
	Key
	Size    uint32
	Mailbox bool
	Epoch   uint64
	Members []Member // live, by rank
	Gone    []uint32 // joined, then left or died; sorted
}

// Update is a view to push to streams.
type Update struct {
	View    View
	Streams []uint64
}

// Errors of a join.
var (
	ErrConflict = errors.New("group conflict")
	ErrInvalid  = errors.New("invalid group membership")
)

// MaxSize bounds a group (and so a view's length).
const MaxSize = 65536

type group struct {
	size    uint32
	mailbox bool
	epoch   uint64
	members map[uint32]Member
	gone    map[uint32]bool
	// watchers: streams that had a member and must hear about the rest
	// (a pod whose member left still sends to the others' mailboxes).
	watchers map[uint64]bool
}

// Directory is safe for concurrent use.
type Directory struct {
	mu     sync.Mutex
	epoch  uint64 // directory-wide, so a group made again never goes back
	groups map[Key]*group
	// byStream: the groups each stream has members in.
	byStream map[uint64]map[Key]bool
}

// New returns an empty directory.
func New() *Directory {
	return &Directory{groups: map[Key]*group{}, byStream: map[uint64]map[Key]bool{}}
}

// Join makes m the rank's member. Joining a rank the same stream already
// holds is a no-op (a re-sent join); a rank held by another stream, a size
// differing from the group's, or a rank outside it is refused.
func (d *Directory) Join(k Key, size uint32, mailbox bool, m Member) (*Update, error) {
	switch {
	case k.Namespace == "" || k.Session == "" || k.Group == "":
		return nil, fmt.Errorf("%w: namespace, session and group are required", ErrInvalid)
	case size == 0 || size > MaxSize:
		return nil, fmt.Errorf("%w: size %d outside 1..%d", ErrInvalid, size, MaxSize)
	case m.Rank >= size:
		return nil, fmt.Errorf("%w: rank %d outside 0..%d", ErrInvalid, m.Rank, size-1)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	g := d.groups[k]
	if g == nil {
		g = &group{size: size, mailbox: mailbox, members: map[uint32]Member{}, gone: map[uint32]bool{}, watchers: map[uint64]bool{}}
		d.groups[k] = g
	}
	if g.size != size {
		return nil, fmt.Errorf("%w: group %s has size %d, not %d", ErrConflict, k, g.size, size)
	}
	if cur, ok := g.members[m.Rank]; ok {
		switch {
		case cur.Stream == m.Stream:
			u := d.update(k, g)
			return &u, nil
		case cur.suspect && cur.Pod == m.Pod:
			// The pod reconnected within the grace: the same member, on
			// its new stream; nobody hears it was ever in doubt.
			g.members[m.Rank] = m
			g.watchers[m.Stream] = true
			d.index(m.Stream, k)
			u := d.update(k, g)
			return &u, nil
		}
		return nil, fmt.Errorf("%w: rank %d of group %s is live in pod %s", ErrConflict, m.Rank, k, cur.Pod)
	}
	g.members[m.Rank] = m
	delete(g.gone, m.Rank)
	g.watchers[m.Stream] = true
	d.index(m.Stream, k)
	d.bump(g)
	u := d.update(k, g)
	return &u, nil
}

// Leave ends the rank's membership if stream holds it.
func (d *Directory) Leave(k Key, rank uint32, stream uint64) *Update {
	d.mu.Lock()
	defer d.mu.Unlock()
	g := d.groups[k]
	if g == nil {
		return nil
	}
	if cur, ok := g.members[rank]; !ok || cur.Stream != stream {
		return nil
	}
	d.remove(g, rank)
	u := d.update(k, g)
	d.collect(k, g)
	return &u
}

// StreamEnded marks the stream's members suspect: Expire, after a grace
// for a reconnect, announces those still suspect gone. A pod whose stream
// broke but which lives (a network blip, an operator that closed it)
// joins its ranks again on its new stream meanwhile and stays a member.
func (d *Directory) StreamEnded(stream uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for k := range d.byStream[stream] {
		if g := d.groups[k]; g != nil {
			for r, m := range g.members {
				if m.Stream == stream {
					m.suspect = true
					g.members[r] = m
				}
			}
		}
	}
}

// Expire removes the stream's members still suspect (their pod did not
// come back) and forgets the stream.
func (d *Directory) Expire(stream uint64) []Update {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []Update
	for k := range d.byStream[stream] {
		g := d.groups[k]
		if g == nil {
			continue
		}
		changed := false
		for r, m := range g.members {
			if m.Stream == stream && m.suspect {
				d.remove(g, r)
				changed = true
			}
		}
		delete(g.watchers, stream)
		if changed {
			out = append(out, d.update(k, g))
		}
		d.collect(k, g)
	}
	delete(d.byStream, stream)
	return out
}

// View returns a group's current view.
func (d *Directory) View(k Key) (View, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	g := d.groups[k]
	if g == nil {
		return View{}, false
	}
	return d.update(k, g).View, true
}

// Groups is the number of groups with members or watchers.
func (d *Directory) Groups() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.groups)
}

func (d *Directory) index(stream uint64, k Key) {
	if d.byStream[stream] == nil {
		d.byStream[stream] = map[Key]bool{}
	}
	d.byStream[stream][k] = true
}

func (d *Directory) remove(g *group, rank uint32) {
	delete(g.members, rank)
	g.gone[rank] = true
	d.bump(g)
}

func (d *Directory) bump(g *group) {
	d.epoch++
	g.epoch = d.epoch
}

// collect forgets a group nobody is in any more.
func (d *Directory) collect(k Key, g *group) {
	if len(g.members) > 0 {
		return
	}
	delete(d.groups, k)
	for s := range g.watchers {
		if ks := d.byStream[s]; ks != nil {
			delete(ks, k)
			if len(ks) == 0 {
				delete(d.byStream, s)
			}
		}
	}
}

// update is the group's view and the streams to push it to.
func (d *Directory) update(k Key, g *group) Update {
	v := View{Key: k, Size: g.size, Mailbox: g.mailbox, Epoch: g.epoch}
	for _, m := range g.members {
		v.Members = append(v.Members, m)
	}
	slices.SortFunc(v.Members, func(a, b Member) int { return int(a.Rank) - int(b.Rank) })
	for r := range g.gone {
		v.Gone = append(v.Gone, r)
	}
	slices.Sort(v.Gone)
	streams := make([]uint64, 0, len(g.watchers))
	for s := range g.watchers {
		streams = append(streams, s)
	}
	slices.Sort(streams)
	return Update{View: v, Streams: streams}
}
