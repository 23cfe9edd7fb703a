package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/ziptrail/ziptrail/internal/dataplane/ref"
	"github.com/ziptrail/ziptrail/internal/dataplane/samenode"
	"github.com/ziptrail/ziptrail/internal/dataplane/store"
)

// The same-node mode (-samenode): a producer and a consumer on one node,
// the object handed over as a sealed memfd on the producer's unix socket
// (internal/dataplane/samenode), side by side with the TCP pull, Redis
// SET+GET and S3 PUT+GET in the same run. Every ziptrail row includes the
// put (the producer's store.Put, plus the memfd copy where the row says
// so) and the get; the consumer touches every page of what it received,
// as a reader of Redis's or S3's bytes has them in memory.
//
//	go run ./bench/dataplane -samenode [-reps 5] [-out docs/bench]
//
// Rows:
//   - memfd, copy at first read: put into the store; the first same-node
//     get copies the object into a sealed memfd (what the sidecar does).
//   - memfd, copy at put: put also copies it into its memfd (Prepare).
//   - memfd → file: like the first, and the consumer copies the mapping
//     into a file in /dev/shm (the sidecar's input path today: the
//     function's get reads a file; one copy).
//   - memfd, produced in place: the producer's object already lives in a
//     sealed memfd (a function that wrote its output into shared memory
//     and hands the descriptor over: Server.Adopt), as the TCP row's
//     object already lives in the producer's heap before its timer
//     starts; timed: the put (store + adopt), the get, touching every page.
//   - TCP pull: today's cross-node path, on loopback.
const (
	snInPlace   = "same node: memfd, produced in place"
	snFirstRead = "same node: memfd, copy at first read"
	snAtPut     = "same node: memfd, copy at put"
	snToFile    = "same node: memfd → /dev/shm file"
	snTCP       = "ziptrail TCP pull"
)

type sameNode struct {
	env  *env
	st   *store.Store
	srv  *samenode.Server
	cli  *samenode.Client
	dir  string
	addr string
	pod  string
	shm  string
}

func setupSameNode(e *env) (*sameNode, error) {
	dir, err := os.MkdirTemp("", "ztsn")
	if err != nil {
		return nil, err
	}
	shm, err := os.MkdirTemp("/dev/shm", "ztsn")
	if err != nil {
		return nil, err
	}
	s := &sameNode{env: e, st: store.New(8<<30, nil), dir: dir, shm: shm, addr: "127.0.0.1:9192", pod: "0b6f6a4e-1c1d-4f7e-9a7e-2f4d1c1b8e11"}
	s.srv = &samenode.Server{Store: s.st, Keys: func() *ref.Keyring { return e.keys }, Addr: s.addr, Pod: s.pod}
	ln, err := s.srv.Listen(dir)
	if err != nil {
		return nil, err
	}
	go func() { _ = s.srv.Serve(ln) }()
	s.cli = &samenode.Client{Dir: dir, Node: "bench-node", Keys: e.keys}
	return s, nil
}

func (s *sameNode) close() {
	_ = s.srv.Close()
	_ = os.RemoveAll(s.dir)
	_ = os.RemoveAll(s.shm)
}

func (s *sameNode) put(ctx context.Context, data []byte, atPut bool) (string, error) {
	id := s.env.id()
	exp := time.Now().Add(time.Minute)
	if err := s.st.Put(ctx, store.Meta{ID: id, Bucket: "b", Key: id, Reads: 1, Expires: exp}, data); err != nil {
		return "", err
	}
	if atPut {
		if err := s.srv.Prepare(id, data); err != nil {
			return "", err
		}
	}
	return s.env.keys.Seal(ref.Record{Addr: s.addr, Key: id, Expires: exp, Reads: 1, Node: "bench-node", Pod: s.pod})
}

var sink byte

// inPlace: the object is in a sealed memfd before the timer starts (see
// the row's description); returns the timed part.
func (s *sameNode) inPlace(ctx context.Context, data []byte) (func() error, error) {
	mf, err := samenode.NewSealed("bench", data)
	if err != nil {
		return nil, err
	}
	return func() error {
		m, err := samenode.MapSealed(mf, int64(len(data)))
		if err != nil {
			return err
		}
		defer samenode.Unmap(m) // the store no longer holds it after its one read
		id := s.env.id()
		exp := time.Now().Add(time.Minute)
		if err := s.st.Put(ctx, store.Meta{ID: id, Bucket: "b", Key: id, Reads: 1, Expires: exp}, m); err != nil {
			return err
		}
		if err := s.srv.Adopt(id, mf, int64(len(data))); err != nil {
			return err
		}
		r, err := s.env.keys.Seal(ref.Record{Addr: s.addr, Key: id, Expires: exp, Reads: 1, Node: "bench-node", Pod: s.pod})
		if err != nil {
			return err
		}
		return s.get(ctx, r, len(data), false)
	}, nil
}

func (s *sameNode) one(ctx context.Context, data []byte, atPut, toFile bool) error {
	r, err := s.put(ctx, data, atPut)
	if err != nil {
		return err
	}
	return s.get(ctx, r, len(data), toFile)
}

func (s *sameNode) get(ctx context.Context, r string, size int, toFile bool) error {
	o, err := s.cli.Get(ctx, r)
	if err != nil {
		return err
	}
	defer o.Close()
	if o.Size != int64(size) {
		return fmt.Errorf("got %d bytes of %d", o.Size, size)
	}
	if toFile {
		f, err := os.OpenFile(filepath.Join(s.shm, "in"), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := f.Truncate(o.Size); err != nil {
			return err
		}
		return o.CopyTo(f)
	}
	m, err := o.Map()
	if err != nil {
		return err
	}
	for i := 0; i < len(m); i += 4096 {
		sink ^= m[i]
	}
	return samenode.Unmap(m)
}

// runSameNode measures the 1-1 rows and prints them with the ratios the
// issue asks for (Redis SET+GET and S3 PUT+GET over the same-node time).
func runSameNode(reps int, outDir string, withS3 bool) error {
	e, err := setup(withS3)
	if err != nil {
		return err
	}
	defer e.close()
	sn, err := setupSameNode(e)
	if err != nil {
		return err
	}
	defer sn.close()
	sdk, err := sn.startSDK()
	if err != nil {
		return err
	}
	defer sdk.close()
	ctx := context.Background()
	systems := []struct {
		name string
		f    func([]byte) error
	}{
		{snSDKInPlace, nil},
		{snSDKPut, func(d []byte) error { return sdk.putBytes(ctx, d) }},
		{snInPlace, nil},
		{snFirstRead, func(d []byte) error { return sn.one(ctx, d, false, false) }},
		{snAtPut, func(d []byte) error { return sn.one(ctx, d, true, false) }},
		{snToFile, func(d []byte) error { return sn.one(ctx, d, false, true) }},
		{snTCP, func(d []byte) error { return e.ztOne(ctx, d) }},
		{"Redis", func(d []byte) error { return e.redisOne(ctx, d) }},
	}
	if withS3 {
		systems = append(systems, struct {
			name string
			f    func([]byte) error
		}{"S3", func(d []byte) error { return e.s3One(ctx, d) }})
	}
	var results []Result
	for _, size := range []int{10_000, 1_000_000, 10_000_000, 100_000_000} {
		data := payload(size)
		for _, sys := range systems {
			times := make([]float64, 0, reps)
			for i := 0; i < reps; i++ {
				f := func() error { return sys.f(data) }
				switch sys.name {
				case snInPlace:
					if f, err = sn.inPlace(ctx, data); err != nil {
						return err
					}
				case snSDKInPlace:
					if f, err = sdk.inPlace(ctx, data); err != nil {
						return err
					}
				}
				t := time.Now()
				if err := f(); err != nil {
					return fmt.Errorf("%s %d: %w", sys.name, size, err)
				}
				times = append(times, time.Since(t).Seconds())
			}
			sort.Float64s(times)
			med := times[len(times)/2]
			results = append(results, Result{Pattern: "1-1 same node", Fan: 1, Size: size, System: sys.name, Seconds: med, MBps: float64(size) / med / 1e6})
			fmt.Fprintf(os.Stderr, ".")
		}
	}
	fmt.Fprintln(os.Stderr)
	cell := map[string]map[int]float64{}
	for _, r := range results {
		if cell[r.System] == nil {
			cell[r.System] = map[int]float64{}
		}
		cell[r.System][r.Size] = r.Seconds
	}
	fmt.Printf("| size |")
	for _, s := range systems {
		fmt.Printf(" %s |", s.name)
	}
	fmt.Printf(" Redis ÷ SDK in place | S3 ÷ SDK in place | Redis ÷ SDK put | S3 ÷ SDK put | Redis ÷ in place | S3 ÷ in place | Redis ÷ first read | S3 ÷ first read | Redis ÷ memfd→file | S3 ÷ memfd→file |\n|---|")
	for range len(systems) + 10 {
		fmt.Print("---|")
	}
	fmt.Println()
	for _, size := range []int{10_000, 1_000_000, 10_000_000, 100_000_000} {
		fmt.Printf("| %s |", human(size))
		for _, s := range systems {
			fmt.Printf(" %s |", dur(cell[s.name][size]))
		}
		ratio := func(other, zt string) string {
			o, ok := cell[other][size]
			if !ok {
				return "–"
			}
			return fmt.Sprintf("%.1f×", o/cell[zt][size])
		}
		fmt.Printf(" %s | %s | %s | %s |", ratio("Redis", snSDKInPlace), ratio("S3", snSDKInPlace), ratio("Redis", snSDKPut), ratio("S3", snSDKPut))
		fmt.Printf(" %s | %s | %s | %s | %s | %s |\n", ratio("Redis", snInPlace), ratio("S3", snInPlace), ratio("Redis", snFirstRead), ratio("S3", snFirstRead), ratio("Redis", snToFile), ratio("S3", snToFile))
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	js, _ := json.MarshalIndent(map[string]any{"host": hostInfo(), "reps": reps, "results": results}, "", "  ")
	path := filepath.Join(outDir, "samenode.json")
	if err := os.WriteFile(path, js, 0o644); err != nil {
		return err
	}
	fmt.Printf("\nwrote %s\n", path)
	return nil
}
