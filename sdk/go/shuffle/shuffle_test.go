package shuffle_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"reflect"
	"strconv"
	"testing"

	"github.com/ziptrail/ziptrail/internal/invocation"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
	"github.com/ziptrail/ziptrail/sdk/go/shuffle"
)

const MiB = 1 << 20

// reduced is what the test reducer answers for a plain reduce: one row
// per input, [mapper, partition, round, sha256, size, tier].
type reduced [][]any

// reduceOp is the test reducer's args.
type reduceOp struct {
	Op        string          `json:"op"`
	Partition int             `json:"partition"`
	Job       json.RawMessage `json:"job"`
}

func concat(pieces [][]byte) ([]byte, error) { return bytes.Join(pieces, nil), nil }

// goReducer is the Go function the tests' reducer pods run: a plain
// reduce (ReadInputs, Cleanup), a hybrid round merge, or a final merge.
func goReducer(ctx context.Context, inv *ziptrail.Invocation) ([]byte, error) {
	var op reduceOp
	if len(inv.Args) > 0 {
		if err := json.Unmarshal(inv.Args, &op); err != nil {
			return nil, err
		}
	}
	switch op.Op {
	case "round_merge":
		job, err := shuffle.JobOf(inv.Objects)
		if err != nil {
			return nil, err
		}
		s, err := shuffle.RoundMerge(ctx, job, inv.Objects, concat)
		if err != nil {
			return nil, err
		}
		return json.Marshal(map[string]any{"bucket": s.Bucket, "key": s.Key, "size": s.Size})
	case "final":
		job, err := shuffle.ParseJob(op.Job)
		if err != nil {
			return nil, err
		}
		runs, err := shuffle.ReadRuns(ctx, job, op.Partition)
		if err != nil {
			return nil, err
		}
		var out []byte
		for _, r := range runs {
			out = append(out, r.Data...)
		}
		if _, err := shuffle.WriteOutput(ctx, job, op.Partition, out, []byte("summary")); err != nil {
			return nil, err
		}
		if _, err := shuffle.DeleteRuns(ctx, job, op.Partition); err != nil {
			return nil, err
		}
		if _, err := shuffle.Done(ctx, job); err != nil {
			return nil, err
		}
		return json.Marshal(map[string]any{"sha256": sum(out), "size": len(out)})
	}
	inputs, err := shuffle.ReadInputs(ctx, inv.Objects)
	if err != nil {
		return nil, err
	}
	res := reduced{}
	for _, in := range inputs {
		var tier any
		if in.Tier != "" {
			tier = string(in.Tier)
		}
		res = append(res, []any{in.Mapper, in.Partition, in.Round, sum(in.Data), len(in.Data), tier})
	}
	if _, err := shuffle.Cleanup(ctx, inputs); err != nil {
		return nil, err
	}
	return json.Marshal(res)
}

// goReducerPod runs goReducer behind its own sidecar, in this process
// (the default client is the pod's).
func (tr *tiers) goReducerPod(t *testing.T) *pod {
	t.Helper()
	shm := t.TempDir() + "/objects"
	t.Setenv("ZIPTRAIL_SHM_DIR", shm) // where FunctionHandler opens pulled inputs
	fn := httptest.NewServer(ziptrail.FunctionHandler(goReducer))
	t.Cleanup(fn.Close)
	p := tr.startPod(t, fn.URL, shm)
	old := ziptrail.SetDefault(p.client)
	t.Cleanup(func() { ziptrail.SetDefault(old) })
	return p
}

// wantRows is the reduce answer for mappers 0..n-1 of partition p.
func wantRows(n, rnd, p, size int, tier string) string {
	rows := reduced{}
	for m := range n {
		var tr any
		if tier != "" {
			tr = tier
		}
		rows = append(rows, []any{strconv.Itoa(m), p, rnd, sum(piece(rnd, m, p, size)), size, tr})
	}
	b, _ := json.Marshal(rows)
	return string(b)
}

// normalize re-encodes a JSON answer (Python's spacing differs).
func normalize(t *testing.T, b []byte) string {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("answer %q: %v", b, err)
	}
	out, _ := json.Marshal(v)
	return string(out)
}

// TestMethods: two Go mappers, three partitions — small, large (a
// shared-memory file) and empty pieces; a Go reducer gets each of its
// pieces intact, whatever the method, and deletes the tier objects it
// consumed. Pod-memory pieces stay in the mapper's pod (by reference);
// pointers travel inline.
func TestMethods(t *testing.T) {
	tr := startTiers(t)
	ctx := context.Background()
	reducer := tr.goReducerPod(t)
	sizes := map[int]int{0: 1000, 1: 3 * MiB, 2: 0}
	for _, method := range []string{shuffle.PodMemory, shuffle.Redis, shuffle.S3} {
		t.Run(method, func(t *testing.T) {
			session := "s-" + method
			job, err := shuffle.NewJob("j1", method, 3, 1)
			if err != nil {
				t.Fatal(err)
			}
			mappers := []*pod{tr.startPod(t, "", ""), tr.startPod(t, "", "")}
			objects := map[int][]invocation.Object{}
			for m, mp := range mappers {
				w, err := shuffle.NewWriter(ctx, job, strconv.Itoa(m), 0, shuffle.WithSession(session), shuffle.WithClient(mp.client))
				if err != nil {
					t.Fatal(err)
				}
				parts := make([][]byte, 3)
				for p, size := range sizes {
					parts[p] = piece(0, m, p, size)
				}
				sent, err := w.WriteAll(ctx, parts)
				if err != nil {
					t.Fatal(err)
				}
				for p, s := range sent {
					if s.Metadata[ziptrail.MetaGroup] != shuffle.Group(p) || s.Bucket != "shuffle-r0" || s.Key != fmt.Sprintf("j1.r0.p%d.m%d", p, m) {
						t.Errorf("sent %+v", s)
					}
					objects[p] = append(objects[p], mp.entries(t, session, s)...)
				}
			}
			if method == shuffle.PodMemory {
				if objects[1][0].Ref == "" {
					t.Error("a large pod-memory piece should stay in the mapper's pod (by reference)")
				}
			} else {
				obj, err := mappers[0].client.TierGet(ctx, job.Tier(), shuffle.TierKey(job, 0, 1, "0"), ziptrail.WithSession(session))
				if err != nil || !bytes.Equal(obj.Bytes(), piece(0, 0, 1, 3*MiB)) {
					t.Fatalf("the tier holds the piece: %v", err)
				}
				obj.Close()
				for _, objs := range objects {
					for _, o := range objs {
						if o.Ref != "" {
							t.Errorf("pointer %s travels by reference", o.Key)
						}
					}
				}
			}
			for p, size := range sizes {
				got := normalize(t, invoke(t, reducer, session, shuffle.Group(p), "inv-"+strconv.Itoa(p), objects[p], nil))
				if want := wantRows(2, 0, p, size, string(job.Tier())); got != want {
					t.Errorf("partition %d: reducer read\n%s\nwant\n%s", p, got, want)
				}
			}
			if method != shuffle.PodMemory {
				for m := range 2 {
					for p := range sizes {
						if _, err := mappers[0].client.TierGet(ctx, job.Tier(), shuffle.TierKey(job, 0, p, strconv.Itoa(m)), ziptrail.WithSession(session)); !errors.Is(err, ziptrail.ErrNotFound) {
							t.Errorf("after the reduce, piece m%d p%d: %v, want not found", m, p, err)
						}
					}
				}
			}
		})
	}
}

// TestHybrid: two rounds of two mappers through Redis; a round merge per
// partition writes one run per round to S3 and frees Redis; a re-executed
// round merge (inputs consumed) sends its run's pointer again; the final
// merge reads a partition's runs in round order, writes the output,
// deletes the runs and sends its Done marker; NextRound emits the next
// round's tasks, then one final task per partition.
func TestHybrid(t *testing.T) {
	tr := startTiers(t)
	ctx := context.Background()
	reducer := tr.goReducerPod(t)
	session := "s-hybrid"
	job, err := shuffle.NewJob("h1", shuffle.Hybrid, 2, 2)
	if err != nil {
		t.Fatal(err)
	}
	mappers := []*pod{tr.startPod(t, "", ""), tr.startPod(t, "", "")}
	c := reducer.client
	on := []shuffle.Option{shuffle.WithSession(session), shuffle.WithClient(c)}
	size := func(r, m, p int) int { return 200_000 + 1000*(r+m+p) }
	for rnd := range 2 {
		objects := map[int][]invocation.Object{}
		for m, mp := range mappers {
			w, err := shuffle.NewWriter(ctx, job, strconv.Itoa(m), rnd, shuffle.WithSession(session), shuffle.WithClient(mp.client))
			if err != nil {
				t.Fatal(err)
			}
			for p := range 2 {
				s, err := w.Write(ctx, p, piece(rnd, m, p, size(rnd, m, p)))
				if err != nil {
					t.Fatal(err)
				}
				objects[p] = append(objects[p], mp.entries(t, session, s)...)
			}
		}
		for p := range 2 {
			var got struct {
				Bucket, Key string
				Size        int64
			}
			// Every invocation has its own id, as the engine gives them:
			// the sidecar answers a repeated id from its idempotency record.
			id := fmt.Sprintf("inv-r%d-p%d", rnd, p)
			answer := invoke(t, reducer, session, shuffle.Group(p), id, objects[p], reduceOp{Op: "round_merge"})
			if err := json.Unmarshal(answer, &got); err != nil || got.Bucket != fmt.Sprintf("runs-r%d", rnd) || got.Key != fmt.Sprintf("h1.run.r%d.p%d", rnd, p) {
				t.Fatalf("round merge: %s %v", answer, err)
			}
			run, err := c.TierGet(ctx, ziptrail.TierSlow, shuffle.RunKey(job, p, rnd), ziptrail.WithSession(session))
			if err != nil {
				t.Fatal(err)
			}
			if want := append(piece(rnd, 0, p, size(rnd, 0, p)), piece(rnd, 1, p, size(rnd, 1, p))...); !bytes.Equal(run.Bytes(), want) {
				t.Errorf("round %d partition %d: the run is not the pieces in mapper order", rnd, p)
			}
			run.Close()
			for m := range 2 {
				if _, err := c.TierGet(ctx, ziptrail.TierFast, shuffle.TierKey(job, rnd, p, strconv.Itoa(m)), ziptrail.WithSession(session)); !errors.Is(err, ziptrail.ErrNotFound) {
					t.Errorf("the fast tier still holds round %d m%d p%d: %v", rnd, m, p, err)
				}
			}
			if again := invoke(t, reducer, session, shuffle.Group(p), id+".r1", objects[p], reduceOp{Op: "round_merge"}); !bytes.Equal(again, answer) {
				t.Errorf("re-executed round merge answered %s, want %s", again, answer)
			}
		}
		sent, err := shuffle.NextRound(ctx, job, rnd, func(next int) ([]shuffle.Task, error) {
			return []shuffle.Task{{Key: fmt.Sprintf("h1.map.r%d.t0", next), Payload: []byte("task")}}, nil
		}, func(p int) ([]byte, error) { return []byte(strconv.Itoa(p)), nil }, on...)
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, s := range sent {
			keys = append(keys, s.Bucket+"/"+s.Key)
		}
		want := []string{"tasks/h1.map.r1.t0"}
		if rnd == 1 {
			want = []string{"final/h1.final.p0", "final/h1.final.p1"}
		}
		if !reflect.DeepEqual(keys, want) {
			t.Errorf("after round %d NextRound sent %v, want %v", rnd, keys, want)
		}
	}
	for p := range 2 {
		got := normalize(t, invoke(t, reducer, session, "", "final-"+strconv.Itoa(p), nil, reduceOp{Op: "final", Partition: p, Job: json.RawMessage(job.Encode())}))
		var want []byte
		for r := range 2 {
			for m := range 2 {
				want = append(want, piece(r, m, p, size(r, m, p))...)
			}
		}
		if exp := normalize(t, fmt.Appendf(nil, `{"sha256":%q,"size":%d}`, sum(want), len(want))); got != exp {
			t.Errorf("final merge of %d: %s, want %s", p, got, exp)
		}
		out, err := shuffle.ReadOutput(ctx, job, p, on...)
		if err != nil || !bytes.Equal(out.Bytes(), want) {
			t.Fatalf("output %d: %v", p, err)
		}
		out.Close()
		if _, err := shuffle.ReadRuns(ctx, job, p, on...); !errors.Is(err, shuffle.ErrConsumed) {
			t.Errorf("runs of %d after the final merge: %v, want ErrConsumed", p, err)
		}
		// The final merge's Done marker is in the ledger bucket.
		if _, err := c.GetObject(ctx, "ledger", "done.final-"+strconv.Itoa(p), ziptrail.WithSession(session)); err != nil {
			t.Errorf("Done marker of final-%d: %v", p, err)
		}
	}
	if s, err := shuffle.Done(ctx, job, on...); s != nil || err != nil {
		t.Errorf("Done outside an invocation: %v %v, want nothing", s, err)
	}
}

func TestJob(t *testing.T) {
	for _, c := range []struct {
		name, method string
		partitions   int
		rounds       int
		want         string
	}{{"j", "disk", 2, 1, "method"}, {"j", shuffle.Redis, 2, 2, "rounds"}, {"a/b", shuffle.S3, 2, 1, "job name"}, {"j", shuffle.S3, 0, 1, "partitions"}} {
		if _, err := shuffle.NewJob(c.name, c.method, c.partitions, c.rounds); !errors.Is(err, ziptrail.ErrInvalid) || !bytes.Contains([]byte(err.Error()), []byte(c.want)) {
			t.Errorf("%+v: %v", c, err)
		}
	}
	j, err := shuffle.NewJob("j", shuffle.Hybrid, 4, 3)
	if err != nil {
		t.Fatal(err)
	}
	j.Params = map[string]any{"x": []any{1.0, 2.0}, "a": "b"}
	back, err := shuffle.ParseJob([]byte(j.Encode()))
	if err != nil || !reflect.DeepEqual(back, j) {
		t.Errorf("round trip: %+v %v, want %+v", back, err, j)
	}
	if p, err := shuffle.PartitionOf(shuffle.Group(3)); p != 3 || err != nil {
		t.Errorf("PartitionOf(p3) = %d %v", p, err)
	}
	for _, g := range []string{"3", "p", "px", "p-1", "p+1"} {
		if _, err := shuffle.PartitionOf(g); err == nil {
			t.Errorf("PartitionOf(%q) accepted", g)
		}
	}
	if _, err := shuffle.ParseJob([]byte(`{"name":"j","method":"s3","partitions":1,"color":"red"}`)); err == nil {
		t.Error("a job with an unknown field was accepted (the Python SDK refuses it)")
	}
	if _, err := shuffle.NewWriter(context.Background(), j, "0", 0); !errors.Is(err, ziptrail.ErrInvalid) {
		t.Errorf("a writer outside an invocation without a session: %v", err)
	}
}

// TestTiers: the client's tier calls, as the library uses them: keys are
// scoped to the session, deletes of missing keys are no error, an unknown
// tier is refused before the sidecar is asked.
func TestTiers(t *testing.T) {
	tr := startTiers(t)
	ctx := context.Background()
	c := tr.startPod(t, "", "").client
	for _, tier := range []ziptrail.Tier{ziptrail.TierFast, ziptrail.TierSlow} {
		data := piece(0, 0, 0, 100_000)
		if n, err := c.TierPut(ctx, tier, "k", data, ziptrail.WithSession("s-a")); err != nil || n != int64(len(data)) {
			t.Fatalf("%s put: %d %v", tier, n, err)
		}
		obj, err := c.TierGet(ctx, tier, "k", ziptrail.WithSession("s-a"))
		if err != nil || !bytes.Equal(obj.Bytes(), data) {
			t.Fatalf("%s get: %v", tier, err)
		}
		obj.Close()
		if _, err := c.TierGet(ctx, tier, "k", ziptrail.WithSession("s-b")); !errors.Is(err, ziptrail.ErrNotFound) {
			t.Errorf("%s: another session's key: %v, want not found", tier, err)
		}
		if err := c.TierDelete(ctx, tier, []string{"k", "never-written"}, ziptrail.WithSession("s-a")); err != nil {
			t.Errorf("%s delete: %v", tier, err)
		}
		if _, err := c.TierGet(ctx, tier, "k", ziptrail.WithSession("s-a")); !errors.Is(err, ziptrail.ErrNotFound) {
			t.Errorf("%s: deleted key: %v, want not found", tier, err)
		}
	}
	if _, err := c.TierGet(ctx, "disk", "k", ziptrail.WithSession("s-a")); !errors.Is(err, ziptrail.ErrInvalid) {
		t.Errorf("tier disk: %v, want invalid", err)
	}
}
