package shuffle_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ziptrail/ziptrail/internal/invocation"
	"github.com/ziptrail/ziptrail/internal/tools/servers"
	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
	"github.com/ziptrail/ziptrail/sdk/go/shuffle"
)

// python is the test environment's Python with the working tree's
// sdk/python first on its path (these sources, not an installed copy).
func python(t *testing.T) (string, []string) {
	t.Helper()
	cache := os.Getenv("ZIPTRAIL_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "ziptrail")
	}
	bin := filepath.Join(cache, "venv", "bin", "python3")
	if _, err := os.Stat(bin); err != nil {
		t.Fatal("no Python venv with the SDK's dependencies: run `eval \"$(hack/install-deps.sh --env)\"`")
	}
	return bin, append(os.Environ(), "PYTHONPATH="+filepath.Join(repoRoot(), "sdk", "python"), "PYTHONDONTWRITEBYTECODE=1")
}

// pyReducer is the Python SDK's test reducer (sdk/python/tests/
// test_shuffle.py's), answering as goReducer does.
const pyReducer = `
import hashlib, json
import ziptrail
from ziptrail import shuffle

def concat(datas):
    return b"".join(bytes(d) for d in datas)

def handler(inv):
    op = json.loads(inv.args or b"{}")
    if op.get("op") == "round_merge":
        job = shuffle.job_of(inv.objects)
        s = shuffle.round_merge(job, inv.objects, concat)
        return json.dumps({"bucket": s.bucket, "key": s.key, "size": s.size})
    if op.get("op") == "final":
        job = shuffle.Job.from_json(op["job"])
        runs = shuffle.read_runs(job, op["partition"])
        out = concat([r.data for r in runs])
        for r in runs:
            r.close()
        shuffle.write_output(job, op["partition"], out, b"summary")
        shuffle.delete_runs(job, op["partition"])
        return json.dumps({"sha256": hashlib.sha256(out).hexdigest(), "size": len(out)})
    inputs = shuffle.read_inputs(inv.objects)
    res = [[i.mapper, i.partition, i.round, hashlib.sha256(i.data).hexdigest(), len(i.data), i.tier]
           for i in inputs]
    for i in inputs:
        i.close()
    shuffle.cleanup(inputs)
    return json.dumps(res)

ziptrail.serve(handler)
`

// pyReducerPod runs pyReducer as the user container of its own pod.
func (tr *tiers) pyReducerPod(t *testing.T) *pod {
	t.Helper()
	port := servers.FreePort(t)
	p := tr.startPod(t, fmt.Sprintf("http://127.0.0.1:%d", port), "")
	bin, env := python(t)
	cmd := exec.Command(bin, "-c", pyReducer)
	cmd.Env = append(append(env, p.env...), "PORT="+strconv.Itoa(port))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	deadline := time.Now().Add(60 * time.Second)
	for {
		if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			c.Close()
			return p
		}
		select {
		case err := <-exited:
			t.Fatalf("the Python function server exited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the Python function server did not listen within 60 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// pyMapper writes mapper m's pieces of a round with the Python SDK's
// Writer and prints the envelope entries of what it sent.
const pyMapper = `
import base64, hashlib, json, sys
from ziptrail import shuffle
from ziptrail.client import default_client

job = shuffle.Job.from_json(sys.argv[1])
m, rnd, session, sizes = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], json.loads(sys.argv[5])

def piece(m, p, size, rnd):
    seed = hashlib.sha256(f"{rnd}/{m}/{p}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]

w = shuffle.Writer(job, m, rnd, session=session)
out = []
for p, size in sizes.items():
    s = w.write(int(p), piece(m, int(p), size, rnd))
    e = {"bucket": s.bucket, "key": s.key, "size": s.size, "metadata": w.metadata[s.key]}
    if s.ref:
        e["ref"] = s.ref
    else:
        with default_client().get_object(s.bucket, s.key, session=session) as d:
            e["inline"] = base64.b64encode(bytes(d)).decode()
    out.append(e)
print(json.dumps({"entries": out, "job": job.encode()}))
`

// runPyMapper runs pyMapper in a mapper pod; it returns the entries by
// partition and the job as Python encoded it.
func runPyMapper(t *testing.T, p *pod, job shuffle.Job, m, rnd int, session string, sizes map[int]int) (map[int]invocation.Object, string) {
	t.Helper()
	bin, env := python(t)
	sz, _ := json.Marshal(sizes)
	cmd := exec.Command(bin, "-c", pyMapper, job.Encode(), strconv.Itoa(m), strconv.Itoa(rnd), session, string(sz))
	cmd.Env = append(env, p.env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python mapper: %v\n%s", err, out)
	}
	var res struct {
		Entries []invocation.Object
		Job     string
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("python mapper printed %q: %v", out, err)
	}
	byPart := map[int]invocation.Object{}
	for _, e := range res.Entries {
		byPart[atoi(t, e.Metadata[shuffle.MetaPartition])] = e
	}
	return byPart, res.Job
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return n
}

// TestCrossLanguage: Go mappers and a Python reducer, and Python mappers
// and a Go reducer, share one job through every method — the Job JSON,
// metadata, tier keys, buckets and pointers are the same in both SDKs; in
// the hybrid, a Python round merge and final merge consume Go mappers'
// rounds and Go reads the output. Both SDKs encode a job byte for byte
// alike.
func TestCrossLanguage(t *testing.T) {
	tr := startTiers(t)
	ctx := context.Background()
	pyRed := tr.pyReducerPod(t)
	goRed := tr.goReducerPod(t)
	sizes := map[int]int{0: 1000, 1: 3 * MiB, 2: 0}
	for _, method := range []string{shuffle.PodMemory, shuffle.Redis, shuffle.S3} {
		t.Run(method, func(t *testing.T) {
			job, err := shuffle.NewJob("x-"+method, method, 3, 1)
			if err != nil {
				t.Fatal(err)
			}
			job.Params = map[string]any{"records": 100.0, "tag": "<x&y> naïve ☃ 𝄞 \u2028", "list": []any{1.0, "two"}}

			// Go mappers, Python reducer.
			session := "go-to-py-" + method
			objects := map[int][]invocation.Object{}
			for m := range 2 {
				mp := tr.startPod(t, "", "")
				w, err := shuffle.NewWriter(ctx, job, strconv.Itoa(m), 0, shuffle.WithSession(session), shuffle.WithClient(mp.client))
				if err != nil {
					t.Fatal(err)
				}
				for p, size := range sizes {
					s, err := w.Write(ctx, p, piece(0, m, p, size))
					if err != nil {
						t.Fatal(err)
					}
					objects[p] = append(objects[p], mp.entries(t, session, s)...)
				}
			}
			for p, size := range sizes {
				got := normalize(t, invoke(t, pyRed, session, shuffle.Group(p), "py-"+strconv.Itoa(p), objects[p], nil))
				if want := wantRows(2, 0, p, size, string(job.Tier())); got != want {
					t.Errorf("Python reducer, partition %d, read\n%s\nwant\n%s", p, got, want)
				}
			}

			// Python mappers, Go reducer.
			session = "py-to-go-" + method
			objects = map[int][]invocation.Object{}
			for m := range 2 {
				byPart, pyJob := runPyMapper(t, tr.startPod(t, "", ""), job, m, 0, session, sizes)
				if pyJob != job.Encode() {
					t.Errorf("the SDKs encode the job differently:\nPython %s\nGo     %s", pyJob, job.Encode())
				}
				for p := range sizes {
					objects[p] = append(objects[p], byPart[p])
				}
			}
			for p, size := range sizes {
				got := normalize(t, invoke(t, goRed, session, shuffle.Group(p), "go-"+strconv.Itoa(p), objects[p], nil))
				if want := wantRows(2, 0, p, size, string(job.Tier())); got != want {
					t.Errorf("Go reducer, partition %d, read\n%s\nwant\n%s", p, got, want)
				}
			}
		})
	}

	t.Run("hybrid", func(t *testing.T) {
		job, err := shuffle.NewJob("xh", shuffle.Hybrid, 2, 2)
		if err != nil {
			t.Fatal(err)
		}
		session := "hybrid-go-py"
		size := func(r, m, p int) int { return 100_000 + 1000*(r+m+p) }
		mappers := []*pod{tr.startPod(t, "", ""), tr.startPod(t, "", "")}
		for rnd := range 2 {
			objects := map[int][]invocation.Object{}
			for m, mp := range mappers {
				if m == 1 {
					// The second mapper is Python's.
					byPart, _ := runPyMapper(t, mp, job, m, rnd, session, map[int]int{0: size(rnd, m, 0), 1: size(rnd, m, 1)})
					for p := range 2 {
						objects[p] = append(objects[p], byPart[p])
					}
					continue
				}
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
			// Partition 0 merges in Python, partition 1 in Go.
			for p, red := range []*pod{pyRed, goRed} {
				invoke(t, red, session, shuffle.Group(p), fmt.Sprintf("merge-r%d-p%d", rnd, p), objects[p], reduceOp{Op: "round_merge"})
			}
		}
		for p, red := range []*pod{goRed, pyRed} { // the final merges the other way round
			invoke(t, red, session, "", fmt.Sprintf("final-%d", p), nil, reduceOp{Op: "final", Partition: p, Job: json.RawMessage(job.Encode())})
			out, err := shuffle.ReadOutput(ctx, job, p, shuffle.WithSession(session), shuffle.WithClient(goRed.client))
			if err != nil {
				t.Fatal(err)
			}
			var want []byte
			for r := range 2 {
				for m := range 2 {
					want = append(want, piece(r, m, p, size(r, m, p))...)
				}
			}
			if got := out.Bytes(); sum(got) != sum(want) {
				t.Errorf("partition %d: output of %d bytes differs from the rounds' pieces (%d bytes)", p, len(got), len(want))
			}
			out.Close()
		}
		if _, err := goRed.client.TierGet(ctx, ziptrail.TierSlow, shuffle.RunKey(job, 0, 0), ziptrail.WithSession(session)); err == nil || !strings.Contains(err.Error(), "not") {
			t.Errorf("runs left after the final merge: %v", err)
		}
	})
}
