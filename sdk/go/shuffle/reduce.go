package shuffle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"

	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// ErrConsumed: a pointer's tier object is gone — an earlier execution of
// this task consumed (and deleted) it. The caller checks for its own
// output (RoundMerge does).
var ErrConsumed = errors.New("shuffle input consumed")

// Input is one piece of a partition. Tier and Key name where a pointer's
// bytes were ("" for pod memory), for Cleanup.
type Input struct {
	Partition int
	Mapper    string
	Round     int
	// Data is the piece: for pod memory the invocation's input (valid until
	// the handler returns), for pointers a copy, or with WithoutCopy the
	// mapping of the sidecar's file (valid until Close).
	Data []byte
	Tier ziptrail.Tier
	Key  string
	obj  *ziptrail.Object
}

// Close releases a mapped piece (WithoutCopy); otherwise it does nothing.
func (i *Input) Close() {
	if i.obj != nil {
		_ = i.obj.Close()
		i.obj, i.Data = nil, nil
	}
}

func isPointer(o *ziptrail.Object) bool { return o.Metadata[MetaKind] == "pointer" }

// fetch reads a tier object, copied out of the pod's shared memory unless
// noCopy.
func fetch(ctx context.Context, c config, tier ziptrail.Tier, key string) ([]byte, *ziptrail.Object, error) {
	obj, err := c.client.TierGet(ctx, tier, key, ziptrail.WithSession(c.session))
	if err != nil {
		if errors.Is(err, ziptrail.ErrNotFound) {
			return nil, nil, fmt.Errorf("%w: %s tier key %s is gone (consumed earlier?)", ErrConsumed, tier, key)
		}
		return nil, nil, err
	}
	if c.noCopy || !obj.Mapped() {
		return obj.Bytes(), obj, nil
	}
	data := slices.Clone(obj.Bytes())
	_ = obj.Close()
	return data, nil, nil
}

func atoi(s string, def int) int {
	if n, err := strconv.Atoi(s); err == nil {
		return n
	}
	return def
}

// ReadInputs returns every input of a reducer, whatever the method:
// objects are the invocation's (Invocation.Objects, the group's shuffle
// objects). Pod-memory pieces are used as they came (the sidecar pulled
// them); pointers are resolved with TierGet, WithParallel at a time. Sorted
// by round, then mapper (numerically when numbers). A pointed-to object
// that is gone is ErrConsumed.
//
// Fetched pieces are copied out of the pod's shared memory by default: a
// pod's /dev/shm is small (64 MiB by default) and a mapped object holds
// its pages there until closed, so concurrent large reads would fill it.
// WithoutCopy keeps the zero-copy mapping (Close the inputs soon).
func ReadInputs(ctx context.Context, objects []*ziptrail.Object, opts ...Option) ([]Input, error) {
	var out []Input
	var ptrs []pointer
	for _, o := range objects {
		if !isPointer(o) {
			m := o.Metadata
			mapper, ok := m[MetaMapper]
			if !ok {
				mapper = o.Key
			}
			out = append(out, Input{Partition: atoi(m[MetaPartition], -1), Mapper: mapper, Round: atoi(m[MetaRound], 0), Data: o.Bytes()})
			continue
		}
		var p pointer
		if err := json.Unmarshal(o.Bytes(), &p); err != nil || p.Version != 1 {
			return nil, invalid("shuffle", "%s/%s: not a shuffle pointer", o.Bucket, o.Key)
		}
		ptrs = append(ptrs, p)
	}
	if len(ptrs) > 0 {
		c, err := setup(ctx, "shuffle", opts)
		if err != nil {
			return nil, err
		}
		fetched := make([]Input, len(ptrs))
		err = each(len(ptrs), min(c.parallel, len(ptrs)), func(i int) error {
			p := ptrs[i]
			data, obj, err := fetch(ctx, c, p.Tier, p.Key)
			fetched[i] = Input{Partition: p.Partition, Mapper: p.mapper(), Round: p.Round, Data: data, Tier: p.Tier, Key: p.Key, obj: obj}
			return err
		})
		if err != nil {
			for i := range fetched {
				fetched[i].Close()
			}
			return nil, err
		}
		out = append(out, fetched...)
	}
	slices.SortStableFunc(out, func(a, b Input) int {
		if a.Round != b.Round {
			return a.Round - b.Round
		}
		return compareMappers(a.Mapper, b.Mapper)
	})
	return out, nil
}

// compareMappers orders numbers numerically, before names (the Python
// SDK's order).
func compareMappers(a, b string) int {
	na, ea := strconv.Atoi(a)
	nb, eb := strconv.Atoi(b)
	switch {
	case ea == nil && eb == nil:
		return na - nb
	case ea == nil:
		return -1
	case eb == nil:
		return 1
	}
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Ref names a tier object.
type Ref struct {
	Tier ziptrail.Tier
	Key  string
}

// Cleanup deletes the tier objects of consumed inputs; pod-memory pieces
// are freed by their bucket's GC. It returns the number of keys deleted.
func Cleanup(ctx context.Context, inputs []Input, opts ...Option) (int, error) {
	var refs []Ref
	for _, i := range inputs {
		if i.Tier != "" && i.Key != "" {
			refs = append(refs, Ref{i.Tier, i.Key})
		}
	}
	return DeleteRefs(ctx, refs, opts...)
}

// DeleteRefs deletes tier objects, 256 keys a request.
func DeleteRefs(ctx context.Context, refs []Ref, opts ...Option) (int, error) {
	if len(refs) == 0 {
		return 0, nil
	}
	c, err := setup(ctx, "shuffle", opts)
	if err != nil {
		return 0, err
	}
	byTier := map[ziptrail.Tier][]string{}
	for _, r := range refs {
		byTier[r.Tier] = append(byTier[r.Tier], r.Key)
	}
	for tier, keys := range byTier {
		for chunk := range slices.Chunk(keys, 256) {
			if err := c.client.TierDelete(ctx, tier, chunk, ziptrail.WithSession(c.session)); err != nil {
				return 0, err
			}
		}
	}
	return len(refs), nil
}
