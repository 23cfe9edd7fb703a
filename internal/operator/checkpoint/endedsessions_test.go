package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

// Ended sessions' records: written under the snapshot's fence (a stale
// writer's are refused whole), in chunks when many, loaded back until they
// expire, dropped once expired or deleted.
func TestEndedRecords(t *testing.T) {
	ctx := context.Background()
	r := servers.StartRedis(t)
	s := &Store{Client: r.Client, Key: "ziptrail:test:b0"}
	now := time.Now()
	rec := func(id string, size int, ttl time.Duration) Record {
		return Record{ID: id, Data: []byte(strings.Repeat(id[:1], size)), Expire: now.Add(ttl)}
	}
	if err := s.Write(ctx, 5, Write{Snapshot: []byte("snap5"), Put: []Record{rec("a1", 10, time.Hour), rec("b1", 10, time.Hour)}}, now); err != nil {
		t.Fatal(err)
	}
	data, gen, found, err := s.Load(ctx)
	if err != nil || !found || gen != 5 || string(data) != "snap5" {
		t.Fatalf("snapshot %q %d %v %v", data, gen, found, err)
	}

	// A writer at the stored generation or below (a demoted owner: another
	// writer) writes nothing: no record, no deletion, no snapshot.
	deposed := &Store{Client: s.Client, Key: s.Key}
	for _, g := range []int64{5, 4} {
		err := deposed.Write(ctx, g, Write{Snapshot: []byte("stale"), Put: []Record{rec("x1", 10, time.Hour)}, Delete: []string{"a1"}}, now)
		if !errors.Is(err, ErrStale) {
			t.Errorf("write at generation %d: %v, want ErrStale", g, err)
		}
		if err := deposed.Write(ctx, g, Write{Put: []Record{rec("y1", 10, time.Hour)}}, now); !errors.Is(err, ErrStale) {
			t.Errorf("records alone at generation %d: %v, want ErrStale", g, err)
		}
		if err := deposed.Check(ctx, g); !errors.Is(err, ErrStale) {
			t.Errorf("check at generation %d: %v, want ErrStale", g, err)
		}
	}
	if err := s.Check(ctx, 6); err != nil {
		t.Errorf("check at generation 6: %v", err)
	}
	got := load(t, s, now)
	if got != "a1 b1" {
		t.Errorf("records after stale writes: %s, want a1 b1", got)
	}

	// Many records (over ChunkBytes): all written, the snapshot last.
	var many []Record
	for i := range 1500 {
		many = append(many, rec(fmt.Sprintf("m%04d", i), 1<<10, time.Hour))
	}
	many = append(many, rec("e1", 10, -time.Second)) // expired already
	if err := s.Write(ctx, 6, Write{Snapshot: []byte("snap6"), Put: many, Delete: []string{"b1"}}, now); err != nil {
		t.Fatal(err)
	}
	recs, err := s.LoadEnded(ctx, now)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1501 {
		t.Errorf("%d records, want 1501 (a1 and the m's)", len(recs))
	}
	for _, r := range recs {
		if r.ID == "b1" || r.ID == "e1" {
			t.Errorf("record %s: deleted or expired", r.ID)
		}
		if r.ID == "m0007" && (len(r.Data) != 1<<10 || r.Expire.Sub(now.Add(time.Hour)).Abs() > time.Millisecond) {
			t.Errorf("record m0007: %d bytes, expires %v", len(r.Data), r.Expire)
		}
	}
	if n, _ := r.Client.HLen(ctx, s.Key+":ended").Result(); n != 1501 {
		t.Errorf("the hash holds %d records, want 1501 (the expired one dropped)", n)
	}
	if ttl, _ := r.Client.PTTL(ctx, s.Key+":ended").Result(); ttl <= 0 || ttl > time.Hour {
		t.Errorf("the records' hash expires in %v, want with its last record (~1h)", ttl)
	}
	// Later, every record expired: none is loaded, the next write drops them.
	later := now.Add(2 * time.Hour)
	if recs, _ := s.LoadEnded(ctx, later); len(recs) != 0 {
		t.Errorf("%d records loaded after they expired", len(recs))
	}
	if err := s.Write(ctx, 7, Write{Snapshot: []byte("snap7")}, later); err != nil {
		t.Fatal(err)
	}
	if n, _ := r.Client.HLen(ctx, s.Key+":ended").Result(); n != 1501-1000 {
		t.Errorf("after one write past their expiry the hash holds %d records, want %d (1000 dropped per write)", n, 1501-1000)
	}
}

func load(t *testing.T, s *Store, now time.Time) string {
	t.Helper()
	recs, err := s.LoadEnded(context.Background(), now)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range recs {
		ids = append(ids, r.ID)
	}
	return strings.Join(ids, " ")
}
