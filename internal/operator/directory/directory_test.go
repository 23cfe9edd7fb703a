package directory

import (
	"errors"
	"slices"
	"testing"
)

func ranks(v View) []uint32 {
	var out []uint32
	for _, m := range v.Members {
		out = append(out, m.Rank)
	}
	return out
}

func TestJoinLeaveAndStreamEnd(t *testing.T) {
	d := New()
	k := Key{"ns", "s1", "g"}
	u0, err := d.Join(k, 3, false, Member{Rank: 0, Stream: 1, Addr: "a:1", Pod: "a"})
	if err != nil {
		t.Fatal(err)
	}
	u1, err := d.Join(k, 3, false, Member{Rank: 1, Stream: 2, Addr: "b:1", Pod: "b"})
	if err != nil {
		t.Fatal(err)
	}
	u2, err := d.Join(k, 3, false, Member{Rank: 2, Stream: 2, Addr: "b:1", Pod: "b"})
	if err != nil {
		t.Fatal(err)
	}
	if !(u0.View.Epoch < u1.View.Epoch && u1.View.Epoch < u2.View.Epoch) {
		t.Fatalf("epochs do not grow: %d %d %d", u0.View.Epoch, u1.View.Epoch, u2.View.Epoch)
	}
	if got := ranks(u2.View); !slices.Equal(got, []uint32{0, 1, 2}) || !slices.Equal(u2.Streams, []uint64{1, 2}) {
		t.Fatalf("view %v to streams %v", got, u2.Streams)
	}
	// A re-sent join of the same stream changes nothing.
	again, err := d.Join(k, 3, false, Member{Rank: 2, Stream: 2})
	if err != nil || again.View.Epoch != u2.View.Epoch {
		t.Fatalf("re-sent join: %v, epoch %d", err, again.View.Epoch)
	}
	// Stream 2's pod dies: after the grace, ranks 1 and 2 are gone and
	// stream 1 hears it.
	d.StreamEnded(2)
	if v, _ := d.View(k); len(v.Gone) != 0 {
		t.Fatalf("gone before the grace ended: %v", v.Gone)
	}
	ups := d.Expire(2)
	if len(ups) != 1 || !slices.Equal(ups[0].View.Gone, []uint32{1, 2}) || !slices.Equal(ranks(ups[0].View), []uint32{0}) ||
		!slices.Equal(ups[0].Streams, []uint64{1}) {
		t.Fatalf("after the stream ended: %+v", ups)
	}
	// A new instance joins as rank 1: live again, no longer gone.
	u, err := d.Join(k, 3, false, Member{Rank: 1, Stream: 3})
	if err != nil || !slices.Equal(u.View.Gone, []uint32{2}) || !slices.Equal(ranks(u.View), []uint32{0, 1}) {
		t.Fatalf("rejoin: %v %+v", err, u)
	}
	// Only the holder's stream leaves a rank.
	if d.Leave(k, 1, 1) != nil {
		t.Fatal("stream 1 left stream 3's rank")
	}
	if u := d.Leave(k, 1, 3); u == nil || !slices.Contains(u.View.Gone, 1) {
		t.Fatalf("leave: %+v", u)
	}
	d.Leave(k, 0, 1)
	if d.Groups() != 0 {
		t.Fatalf("%d groups left after every member ended", d.Groups())
	}
	// Made again, its epochs still grow.
	u, _ = d.Join(k, 3, false, Member{Rank: 0, Stream: 1})
	if u.View.Epoch <= u2.View.Epoch {
		t.Fatalf("a group made again went back to epoch %d", u.View.Epoch)
	}
}

func TestJoinRefusals(t *testing.T) {
	d := New()
	k := Key{"ns", "s1", "g"}
	if _, err := d.Join(k, 2, false, Member{Rank: 0, Stream: 1}); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		k       Key
		size    uint32
		m       Member
		wantErr error
	}{
		"rank taken by another pod": {k, 2, Member{Rank: 0, Stream: 2}, ErrConflict},
		"another size":              {k, 3, Member{Rank: 1, Stream: 2}, ErrConflict},
		"rank outside the group":    {k, 2, Member{Rank: 2, Stream: 2}, ErrInvalid},
		"size zero":                 {Key{"ns", "s1", "h"}, 0, Member{Rank: 0, Stream: 2}, ErrInvalid},
		"too large":                 {Key{"ns", "s1", "h"}, MaxSize + 1, Member{Rank: 0, Stream: 2}, ErrInvalid},
		"no session":                {Key{"ns", "", "h"}, 2, Member{Rank: 0, Stream: 2}, ErrInvalid},
	} {
		if _, err := d.Join(tc.k, tc.size, false, tc.m); !errors.Is(err, tc.wantErr) {
			t.Errorf("%s: %v, want %v", name, err, tc.wantErr)
		}
	}
	// Namespaces are apart: the same names in another namespace are
	// another group.
	if _, err := d.Join(Key{"other", "s1", "g"}, 5, false, Member{Rank: 0, Stream: 9}); err != nil {
		t.Fatalf("another namespace's group: %v", err)
	}
}

// TestReconnectWithinGrace: a pod whose stream broke joins its rank again
// on a new stream before the grace ends: it stays a member, nobody is told
// it was gone, and the old stream's expiry changes nothing.
func TestReconnectWithinGrace(t *testing.T) {
	d := New()
	k := Key{"ns", "s1", "g"}
	if _, err := d.Join(k, 2, false, Member{Rank: 0, Stream: 1, Pod: "a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Join(k, 2, false, Member{Rank: 1, Stream: 2, Pod: "b"}); err != nil {
		t.Fatal(err)
	}
	d.StreamEnded(2)
	// Another pod may not take the suspect rank.
	if _, err := d.Join(k, 2, false, Member{Rank: 1, Stream: 9, Pod: "intruder"}); !errors.Is(err, ErrConflict) {
		t.Fatalf("another pod took a suspect rank: %v", err)
	}
	u, err := d.Join(k, 2, false, Member{Rank: 1, Stream: 3, Pod: "b"})
	if err != nil || len(u.View.Gone) != 0 || !slices.Equal(ranks(u.View), []uint32{0, 1}) {
		t.Fatalf("rejoin: %v %+v", err, u)
	}
	if ups := d.Expire(2); len(ups) != 0 {
		t.Fatalf("the old stream's expiry announced %+v", ups)
	}
	if v, _ := d.View(k); len(v.Gone) != 0 || v.Members[1].Stream != 3 {
		t.Fatalf("after expiry: %+v", v)
	}
}
