package controlclient

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/ziptrail/ziptrail/internal/operator/control/controlv1"
)

// Kept reports (docs/guarantees.md, "What durability costs a step").
//
// The sidecar reports the outcome of every invocation over its control
// stream, so that an owner that lost the dispatcher's answer (a restart, a
// handover, a broken connection) still learns it. For an invocation the
// operator's dispatcher sent, that report is a second copy of what the
// answer tells the operator, and sending it on every step doubled the
// control traffic of a chain. Such a report is therefore kept here, unsent,
// under an id the answer names (Reserve, Keep); the operator, having
// applied the answer, releases the id once a saved checkpoint holds it
// (OperatorMessage Saved). A report is sent after all, as an ordinary
// event, when:
//   - no release came within KeepFor of its keeping (the answer was lost,
//     or the owner crashed before saving it);
//   - a new stream begins (the owner may be another one, which learns the
//     outcome only from the report).
//
// Ids are random: a release names only ids the operator read in answers,
// and one pod cannot guess another's.

// DefaultKeepFor is how long a kept report waits for its release.
const DefaultKeepFor = 5 * time.Second

// keptReport is one reservation: its messages once kept.
type keptReport struct {
	msgs     []*controlv1.SidecarMessage
	filled   bool
	released bool // released before it was filled: Keep drops it
	flush    bool // a new stream began before it was filled: Keep sends it
	at       time.Time
	n        uint64 // the order it was filled in: reports are sent in it
}

// Reserve returns a new id for a report the caller will Keep (or drop, by
// Keep with no messages): the id the answer names.
func (c *Client) Reserve() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.kept == nil {
		c.kept = map[uint64]*keptReport{}
	}
	for {
		id := rand.Uint64()
		if id != 0 && c.kept[id] == nil {
			c.kept[id] = &keptReport{}
			return id
		}
	}
}

// Keep holds msgs under id until the operator releases it, or sends them
// (see above). Keep with no messages ends the reservation: nothing was
// kept. Kept reports count against QueueLimit with the events: with as
// many waiting, Keep waits for room as Send does, and fails (keeping
// nothing) with ErrQueueFull after QueueWait.
func (c *Client) Keep(id uint64, msgs ...*controlv1.SidecarMessage) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if k := c.kept[id]; len(msgs) == 0 || k != nil && k.released && !k.filled {
		c.drop(id)
		return nil
	}
	if err := c.waitRoom(); err != nil {
		c.drop(id)
		return err
	}
	k := c.kept[id]
	switch {
	case k == nil || k.filled:
		// Not a reservation of this client: sent, never lost.
		c.queue(msgs)
	case k.released:
		delete(c.kept, id)
	case k.flush:
		delete(c.kept, id)
		c.queue(msgs)
	default:
		c.keptN++
		k.msgs, k.filled, k.at, k.n = msgs, true, time.Now(), c.keptN
		c.keptFilled++
	}
	return nil
}

// drop forgets the reservation id, kept report or not. c.mu is held.
func (c *Client) drop(id uint64) {
	if k := c.kept[id]; k != nil && k.filled {
		c.keptFilled--
	}
	delete(c.kept, id)
}

// release forgets the reports the operator saved.
func (c *Client) release(ids []uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	freed := false
	for _, id := range ids {
		k := c.kept[id]
		switch {
		case k == nil:
		case k.filled:
			delete(c.kept, id)
			c.keptFilled--
			freed = true
		default:
			k.released = true
		}
	}
	if freed {
		close(c.room)
		c.room = make(chan struct{})
	}
}

// sendKept queues as events the kept reports kept before cutoff (every one
// when cutoff is zero, and then the reservations not filled yet are sent
// once filled). c.mu is held.
func (c *Client) sendKept(cutoff time.Time) {
	var due []*keptReport
	for id, k := range c.kept {
		switch {
		case !k.filled:
			if cutoff.IsZero() {
				k.flush = true
			}
		case cutoff.IsZero() || k.at.Before(cutoff):
			delete(c.kept, id)
			c.keptFilled--
			due = append(due, k)
		}
	}
	slices.SortFunc(due, func(a, b *keptReport) int { return cmp.Compare(a.n, b.n) })
	for _, k := range due {
		c.queue(k.msgs)
	}
}

// Kept is the number of reports kept unsent.
func (c *Client) Kept() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.keptFilled
}

// keepFor is KeepFor or its default.
func (c *Client) keepFor() time.Duration {
	if c.KeepFor > 0 {
		return c.KeepFor
	}
	return DefaultKeepFor
}
