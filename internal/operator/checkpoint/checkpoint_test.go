package checkpoint

import (
	"context"
	"errors"
	"testing"

	"github.com/ziptrail/ziptrail/internal/tools/servers"
)

func TestSaveLoadAndFencing(t *testing.T) {
	ctx := context.Background()
	s := &Store{Client: servers.StartRedis(t).Client, Key: "ziptrail:test"}
	if _, _, found, err := s.Load(ctx); err != nil || found {
		t.Fatalf("empty store: found=%v err=%v", found, err)
	}
	if err := s.Save(ctx, 1, []byte("one")); err != nil {
		t.Fatal(err)
	}
	if err := s.Save(ctx, 2, []byte("two\x00binary")); err != nil {
		t.Fatal(err)
	}
	data, gen, found, err := s.Load(ctx)
	if err != nil || !found || gen != 2 || string(data) != "two\x00binary" {
		t.Fatalf("load: %q %d %v %v", data, gen, found, err)
	}
	// A deposed leader (another writer) still at generation 2 cannot
	// overwrite.
	deposed := &Store{Client: s.Client, Key: s.Key}
	if err := deposed.Save(ctx, 2, []byte("stale")); !errors.Is(err, ErrStale) {
		t.Errorf("same generation: %v, want ErrStale", err)
	}
	if err := deposed.Save(ctx, 1, []byte("older")); !errors.Is(err, ErrStale) {
		t.Errorf("older generation: %v, want ErrStale", err)
	}
	if data, _, _, _ := s.Load(ctx); string(data) != "two\x00binary" {
		t.Errorf("after stale writes: %q", data)
	}
}
