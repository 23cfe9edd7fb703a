// Package shuffle is the Go shuffle library for MapReduce-style jobs
// (Locus, NSDI '19, §3) on top of DynamicGroup: a partition is a group. It
// mirrors the Python SDK's ziptrail.shuffle (sdk/python/ziptrail/shuffle.py)
// object for object — the same Job JSON, object metadata, tier keys, bucket
// names and pointer format — so a Go mapper and a Python reducer (or the
// reverse) work on one job; docs/shuffle.md describes the protocol.
//
// A Job names itself, its storage method and its number of partitions.
// Mappers write partition p of their output with a Writer; the workflow's
// DynamicGroup trigger on the round's shuffle bucket ("shuffle-r<round>",
// group metadata "group=p<p>") invokes one reducer per partition once every
// mapper finished; the reducer reads its inputs with ReadInputs (whatever
// the method) and frees them with Cleanup. The methods:
//
//   - podmemory: the partition is the shuffle bucket's object itself; its
//     bytes stay in the mapper's pod and the reducer's sidecar pulls them
//     directly when it resolves the invocation.
//   - redis, s3: the partition goes to the fast (Redis) or slow (S3) tier
//     (Client.TierPut) under TierKey, and a small pointer object (JSON) with
//     the same group goes into the shuffle bucket; ReadInputs resolves it
//     with TierGet.
//   - hybrid: Locus's multi-round shuffle (§3.4): round r's mappers write to
//     the fast tier; RoundMerge (one per partition, the DynamicGroup target
//     of shuffle-r<r>) turns the round's pieces into one sorted run in the
//     slow tier (RunKey) and frees the fast tier; NextRound (the
//     DynamicJoin target of runs-r<r>) emits the next round's map tasks or
//     the final merges; a final merge reads a partition's runs (ReadRuns).
//
// Objects are sent through the sidecar (Client.SendObject, tagged with the
// context's invocation), never in the response. Every stage is idempotent:
// keys are deterministic, and a re-executed merge whose inputs were
// consumed finds its output in the slow tier (ErrConsumed). Done sends the
// per-invocation marker the workflow's re-execution rules watch.
//
// Calls take the session and the client from the context's invocation
// (ziptrail.CurrentInvocation) and ziptrail.Default(); WithSession and
// WithClient set them outside a handler.
package shuffle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf16"

	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// Methods.
const (
	PodMemory = "podmemory"
	Redis     = "redis"
	S3        = "s3"
	Hybrid    = "hybrid"
)

// Methods lists the methods.
var Methods = []string{PodMemory, Redis, S3, Hybrid}

// Metadata of the shuffle bucket's objects.
const (
	MetaKind      = "zt-shuffle" // "data" (podmemory), "pointer", "run" or "final"
	MetaMapper    = "zt-mapper"
	MetaPartition = "zt-partition"
	MetaRound     = "zt-round"
	MetaJob       = "zt-job" // the Job (JSON), on every object a stage receives
	// PointerVersion is the field a pointer object's JSON carries (value 1).
	PointerVersion = "zt-shuffle-pointer"
)

// Bucket names a workflow declares (overridable per job).
const (
	TasksBucket   = "tasks"
	FinalBucket   = "final"
	OutputBucket  = "parts"
	ShufflePrefix = "shuffle-r"
	RunsPrefix    = "runs-r"
	LedgerBucket  = "ledger"
)

// Job is one shuffle job of a session. Its JSON is the Python SDK's (the
// fields' snake_case names); zero bucket names and Rounds take the
// defaults.
type Job struct {
	// Name makes the job's keys unique in the session (letters, digits,
	// '-', '_', '.').
	Name   string `json:"name"`
	Method string `json:"method"`
	// Partitions is the number of reducers (groups p0 .. p<Partitions-1>).
	Partitions int `json:"partitions"`
	// Rounds is the hybrid's number of rounds (1 for the other methods).
	Rounds int `json:"rounds"`
	// Params is the application's own configuration, carried with the job
	// through every stage.
	Params        map[string]any `json:"params"`
	TasksBucket   string         `json:"tasks_bucket"`
	FinalBucket   string         `json:"final_bucket"`
	OutputBucket  string         `json:"output_bucket"`
	ShufflePrefix string         `json:"shuffle_prefix"`
	RunsPrefix    string         `json:"runs_prefix"`
	LedgerBucket  string         `json:"ledger_bucket"`
}

// withDefaults fills the zero fields.
func (j Job) withDefaults() Job {
	if j.Rounds == 0 {
		j.Rounds = 1
	}
	if j.Params == nil {
		j.Params = map[string]any{}
	}
	for _, f := range []struct {
		v   *string
		def string
	}{{&j.TasksBucket, TasksBucket}, {&j.FinalBucket, FinalBucket}, {&j.OutputBucket, OutputBucket},
		{&j.ShufflePrefix, ShufflePrefix}, {&j.RunsPrefix, RunsPrefix}, {&j.LedgerBucket, LedgerBucket}} {
		if *f.v == "" {
			*f.v = f.def
		}
	}
	return j
}

// NewJob returns a valid job with the default buckets.
func NewJob(name, method string, partitions, rounds int) (Job, error) {
	j := Job{Name: name, Method: method, Partitions: partitions, Rounds: rounds}.withDefaults()
	return j, j.Validate()
}

func invalid(op string, format string, args ...any) error {
	return &ziptrail.Error{Kind: ziptrail.KindInvalid, Op: op, Err: fmt.Errorf(format, args...)}
}

// Validate says what is wrong with the job, as the Python SDK does.
func (j Job) Validate() error {
	j = j.withDefaults()
	switch {
	case !slices.Contains(Methods, j.Method):
		return invalid("shuffle", "method %q: one of %s", j.Method, strings.Join(Methods, ", "))
	case j.Name == "" || strings.IndexFunc(j.Name, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.')
	}) >= 0:
		return invalid("shuffle", "job name %q: letters, digits, '-', '_' and '.' only", j.Name)
	case j.Partitions < 1:
		return invalid("shuffle", "partitions must be at least 1, got %d", j.Partitions)
	case j.Rounds < 1 || (j.Rounds > 1 && j.Method != Hybrid):
		return invalid("shuffle", "rounds %d: at least 1, and more than 1 only for hybrid", j.Rounds)
	}
	return nil
}

// Tier is where the mappers' partitions go; "" for pod memory.
func (j Job) Tier() ziptrail.Tier {
	switch j.Method {
	case Redis, Hybrid:
		return ziptrail.TierFast
	case S3:
		return ziptrail.TierSlow
	}
	return ""
}

// ShuffleBucket is round's shuffle bucket.
func (j Job) ShuffleBucket(round int) string {
	return j.withDefaults().ShufflePrefix + strconv.Itoa(round)
}

// RunsBucket is round's bucket of hybrid runs.
func (j Job) RunsBucket(round int) string { return j.withDefaults().RunsPrefix + strconv.Itoa(round) }

// Encode is the job's compact JSON with sorted keys, as the zt-job
// metadata carries it: byte for byte the Python SDK's encoding
// (json.dumps with sort_keys, compact separators, ASCII only).
func (j Job) Encode() string {
	j = j.withDefaults()
	// Through a map: encoding/json sorts map keys, at every level.
	var m map[string]any
	b, _ := json.Marshal(j)
	_ = json.Unmarshal(b, &m)
	var buf strings.Builder
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // Python leaves <, > and & as they are
	_ = enc.Encode(m)
	// Python escapes every non-ASCII character as \uXXXX (surrogate pairs
	// beyond the BMP); inside JSON strings is the only place they occur.
	var out strings.Builder
	for _, r := range strings.TrimSuffix(buf.String(), "\n") {
		switch {
		case r < 0x80:
			out.WriteRune(r)
		case r > 0xFFFF:
			r1, r2 := utf16.EncodeRune(r)
			fmt.Fprintf(&out, "\\u%04x\\u%04x", r1, r2)
		default:
			fmt.Fprintf(&out, "\\u%04x", r)
		}
	}
	return out.String()
}

// ParseJob reads a job's JSON (Encode's, or the Python SDK's) and
// validates it.
func ParseJob(data []byte) (Job, error) {
	var j Job
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&j); err != nil {
		return Job{}, invalid("shuffle", "job %q: %v", truncate(string(data)), err)
	}
	j = j.withDefaults()
	return j, j.Validate()
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// JobOf is the job of a stage's input objects (their zt-job metadata).
func JobOf(objects []*ziptrail.Object) (Job, error) {
	for _, o := range objects {
		if v, ok := o.Metadata[MetaJob]; ok {
			return ParseJob([]byte(v))
		}
	}
	return Job{}, invalid("shuffle", "no input object names its shuffle job (zt-job metadata)")
}

// Group is the DynamicGroup group of a partition.
func Group(partition int) string { return "p" + strconv.Itoa(partition) }

// PartitionOf is the partition of a group.
func PartitionOf(group string) (int, error) {
	n, err := strconv.Atoi(strings.TrimPrefix(group, "p"))
	if !strings.HasPrefix(group, "p") || err != nil || n < 0 || strings.HasPrefix(group, "p+") {
		return 0, invalid("shuffle", "group %q is not a shuffle partition (p<n>)", group)
	}
	return n, nil
}

// TierKey is the tier key of mapper's piece of a partition in a round.
func TierKey(j Job, round, partition int, mapper string) string {
	return fmt.Sprintf("%s/r%d/p%d/m%s", j.Name, round, partition, mapper)
}

// ObjectKey is the shuffle bucket's object key of that piece.
func ObjectKey(j Job, round, partition int, mapper string) string {
	return fmt.Sprintf("%s.r%d.p%d.m%s", j.Name, round, partition, mapper)
}

// RunKey is the slow-tier key of a partition's sorted run of a round.
func RunKey(j Job, partition, round int) string {
	return fmt.Sprintf("%s/run/p%d/r%d", j.Name, partition, round)
}

// OutputKey is the slow-tier key of a partition's output (WriteOutput).
func OutputKey(j Job, partition int) string { return fmt.Sprintf("%s/out/p%d", j.Name, partition) }

// Option sets the session, client or parallelism of a call.
type Option func(*config)

type config struct {
	session  string
	client   *ziptrail.Client
	parallel int
	noCopy   bool
}

// WithSession sets the session (default: the context's invocation's).
func WithSession(id string) Option { return func(c *config) { c.session = id } }

// WithClient sets the client (default: ziptrail.Default()).
func WithClient(cl *ziptrail.Client) Option { return func(c *config) { c.client = cl } }

// WithParallel sets how many tier reads or writes run at once (default 4).
func WithParallel(n int) Option { return func(c *config) { c.parallel = n } }

// WithoutCopy keeps fetched pieces as mappings of the sidecar's files
// instead of copying them out (ReadInputs, ReadRuns); see ReadInputs.
func WithoutCopy() Option { return func(c *config) { c.noCopy = true } }

func setup(ctx context.Context, op string, opts []Option) (config, error) {
	c := config{parallel: 4}
	if inv, ok := ziptrail.CurrentInvocation(ctx); ok {
		c.session = inv.Session
	}
	for _, o := range opts {
		o(&c)
	}
	if c.session == "" {
		return c, invalid(op, "outside a function invocation: pass WithSession")
	}
	if c.client == nil {
		var err error
		if c.client, err = ziptrail.Default(); err != nil {
			return c, err
		}
	}
	c.parallel = max(1, c.parallel)
	return c, nil
}

// Sent is an object the library sent, with the metadata it carried.
type Sent struct {
	Bucket, Key string
	Ref         string // empty when small enough to travel inline
	Size        int64
	Metadata    map[string]string
}

func send(ctx context.Context, c config, op, bucket, key string, data []byte, meta map[string]string) (*Sent, error) {
	s, err := c.client.SendObject(ctx, &ziptrail.BucketObject{Bucket: bucket, Key: key, Data: data, Metadata: meta}, false, ziptrail.WithSession(c.session))
	if err != nil {
		return nil, err
	}
	return &Sent{Bucket: bucket, Key: key, Ref: s.Ref, Size: s.Size, Metadata: maps.Clone(meta)}, nil
}

// pointer is a pointer object's JSON.
type pointer struct {
	Version   int           `json:"zt-shuffle-pointer"`
	Tier      ziptrail.Tier `json:"tier"`
	Key       string        `json:"key"`
	Size      int64         `json:"size"`
	Mapper    any           `json:"mapper"`
	Partition int           `json:"partition"`
	Round     int           `json:"round"`
}

func (p pointer) mapper() string {
	switch m := p.Mapper.(type) {
	case string:
		return m
	case float64:
		return strconv.FormatFloat(m, 'f', -1, 64)
	}
	return fmt.Sprint(p.Mapper)
}

// Writer writes a mapper's partitions for one round of a job. It is safe
// for concurrent use.
type Writer struct {
	Job    Job
	Mapper string
	Round  int
	cfg    config
	job    string

	mu   sync.Mutex
	sent []*Sent
}

// NewWriter starts mapper's writes of a round (mapper: unique in the
// round, its task number).
func NewWriter(ctx context.Context, job Job, mapper string, round int, opts ...Option) (*Writer, error) {
	job = job.withDefaults()
	if err := job.Validate(); err != nil {
		return nil, err
	}
	if round < 0 || round >= job.Rounds {
		return nil, invalid("shuffle", "round %d of a job of %d", round, job.Rounds)
	}
	cfg, err := setup(ctx, "shuffle", opts)
	if err != nil {
		return nil, err
	}
	return &Writer{Job: job, Mapper: mapper, Round: round, cfg: cfg, job: job.Encode()}, nil
}

// Write writes this mapper's piece of a partition (empty pieces too: every
// partition must exist as a group).
func (w *Writer) Write(ctx context.Context, partition int, data []byte) (*Sent, error) {
	job := w.Job
	if partition < 0 || partition >= job.Partitions {
		return nil, invalid("shuffle", "partition %d of %d", partition, job.Partitions)
	}
	meta := map[string]string{ziptrail.MetaGroup: Group(partition), MetaMapper: w.Mapper, MetaPartition: strconv.Itoa(partition),
		MetaRound: strconv.Itoa(w.Round), MetaJob: w.job}
	okey, bucket := ObjectKey(job, w.Round, partition, w.Mapper), job.ShuffleBucket(w.Round)
	var s *Sent
	var err error
	if tier := job.Tier(); tier == "" {
		meta[MetaKind] = "data"
		s, err = send(ctx, w.cfg, "shuffle", bucket, okey, data, meta)
	} else {
		key := TierKey(job, w.Round, partition, w.Mapper)
		var size int64
		if size, err = w.cfg.client.TierPut(ctx, tier, key, data, ziptrail.WithSession(w.cfg.session)); err != nil {
			return nil, err
		}
		meta[MetaKind] = "pointer"
		ptr, _ := json.Marshal(pointer{Version: 1, Tier: tier, Key: key, Size: size, Mapper: w.Mapper, Partition: partition, Round: w.Round})
		s, err = send(ctx, w.cfg, "shuffle", bucket, okey, ptr, meta)
	}
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	w.sent = append(w.sent, s)
	w.mu.Unlock()
	return s, nil
}

// WriteAll writes every partition (len(parts) == Job.Partitions), the
// writer's parallelism (WithParallel) at a time.
func (w *Writer) WriteAll(ctx context.Context, parts [][]byte) ([]*Sent, error) {
	if len(parts) != w.Job.Partitions {
		return nil, invalid("shuffle", "%d parts for %d partitions", len(parts), w.Job.Partitions)
	}
	out := make([]*Sent, len(parts))
	err := each(len(parts), w.cfg.parallel, func(p int) (err error) {
		out[p], err = w.Write(ctx, p, parts[p])
		return err
	})
	return out, err
}

// Sent lists what the writer sent so far.
func (w *Writer) Sent() []*Sent {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.sent)
}

// each runs f(0..n-1), parallel at a time, and returns their errors.
func each(n, parallel int, f func(i int) error) error {
	errs := make([]error, n)
	sem := make(chan struct{}, max(1, parallel))
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			errs[i] = f(i)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
