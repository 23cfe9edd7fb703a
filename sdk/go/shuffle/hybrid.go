package shuffle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	ziptrail "github.com/ziptrail/ziptrail/sdk/go"
)

// RoundMerge is a hybrid round's merge for one partition (the DynamicGroup
// target of shuffle-r<r>): it reads the round's pieces from the fast tier,
// combine (the pieces' data, in mapper order) makes the sorted run, which
// is written to the slow tier under RunKey; a pointer goes to runs-r<r>,
// declaring Job.Partitions members for the DynamicJoin; then the fast
// tier's pieces are deleted. Re-executed after its pieces were consumed,
// it sends the pointer of the run an earlier execution wrote.
func RoundMerge(ctx context.Context, job Job, objects []*ziptrail.Object, combine func(pieces [][]byte) ([]byte, error), opts ...Option) (*Sent, error) {
	job = job.withDefaults()
	if len(objects) == 0 {
		return nil, invalid("round merge", "no inputs")
	}
	m := objects[0].Metadata
	rnd := atoi(m[MetaRound], 0)
	p, err := strconv.Atoi(m[MetaPartition])
	if err != nil {
		return nil, invalid("round merge", "%s/%s has no partition (zt-partition metadata)", objects[0].Bucket, objects[0].Key)
	}
	c, err := setup(ctx, "round merge", opts)
	if err != nil {
		return nil, err
	}
	key := RunKey(job, p, rnd)
	inputs, err := ReadInputs(ctx, objects, opts...)
	if errors.Is(err, ErrConsumed) {
		// An earlier execution consumed the pieces: its run must be there.
		run, gerr := c.client.TierGet(ctx, ziptrail.TierSlow, key, ziptrail.WithSession(c.session))
		if gerr != nil {
			return nil, &ziptrail.Error{Kind: ziptrail.KindNotFound, Op: "round merge", Err: fmt.Errorf("round %d partition %d: inputs consumed and no run %s: %w", rnd, p, key, gerr)}
		}
		size := run.Size
		_ = run.Close()
		return sendRun(ctx, c, job, p, rnd, key, size)
	}
	if err != nil {
		return nil, err
	}
	pieces := make([][]byte, len(inputs))
	for i, in := range inputs {
		pieces[i] = in.Data
	}
	run, err := combine(pieces)
	var size int64
	if err == nil {
		size, err = c.client.TierPut(ctx, ziptrail.TierSlow, key, run, ziptrail.WithSession(c.session))
	}
	for i := range inputs {
		inputs[i].Close()
	}
	if err != nil {
		return nil, err
	}
	sent, err := sendRun(ctx, c, job, p, rnd, key, size)
	if err != nil {
		return nil, err
	}
	_, err = Cleanup(ctx, inputs, opts...)
	return sent, err
}

func sendRun(ctx context.Context, c config, job Job, p, rnd int, key string, size int64) (*Sent, error) {
	ptr, _ := json.Marshal(pointer{Version: 1, Tier: ziptrail.TierSlow, Key: key, Size: size, Mapper: fmt.Sprintf("round%d", rnd), Partition: p, Round: rnd})
	meta := map[string]string{MetaKind: "run", MetaPartition: strconv.Itoa(p), MetaRound: strconv.Itoa(rnd),
		ziptrail.MetaExpectedCount: strconv.Itoa(job.Partitions), MetaJob: job.Encode()}
	return send(ctx, c, "round merge", job.RunsBucket(rnd), fmt.Sprintf("%s.run.r%d.p%d", job.Name, rnd, p), ptr, meta)
}

// RoundOfRuns is the round whose runs a next-round invocation received.
func RoundOfRuns(objects []*ziptrail.Object) (int, error) {
	rounds := map[int]bool{}
	for _, o := range objects {
		if v, ok := o.Metadata[MetaRound]; ok {
			rounds[atoi(v, -1)] = true
		}
	}
	if len(rounds) != 1 {
		return 0, invalid("next round", "inputs of %d rounds: expected one round's runs", len(rounds))
	}
	for r := range rounds {
		return r, nil
	}
	return 0, nil
}

// Task is a map task NextRound sends: its key in the tasks bucket and its
// payload.
type Task struct {
	Key     string
	Payload []byte
}

// NextRound runs after round finished: it sends round finished+1's map
// tasks (emit(round)) to the tasks bucket, or, after the last round, one
// final-merge task per partition (final(partition)'s payload, key
// "<job>.final.p<p>") to the final bucket.
func NextRound(ctx context.Context, job Job, finished int, emit func(round int) ([]Task, error), final func(partition int) ([]byte, error), opts ...Option) ([]*Sent, error) {
	job = job.withDefaults()
	c, err := setup(ctx, "next round", opts)
	if err != nil {
		return nil, err
	}
	next := finished + 1
	var out []*Sent
	if next < job.Rounds {
		tasks, err := emit(next)
		if err != nil {
			return nil, err
		}
		for _, t := range tasks {
			s, err := send(ctx, c, "next round", job.TasksBucket, t.Key, t.Payload, map[string]string{MetaRound: strconv.Itoa(next), MetaJob: job.Encode()})
			if err != nil {
				return out, err
			}
			out = append(out, s)
		}
		return out, nil
	}
	for p := range job.Partitions {
		payload, err := final(p)
		if err != nil {
			return out, err
		}
		s, err := send(ctx, c, "next round", job.FinalBucket, fmt.Sprintf("%s.final.p%d", job.Name, p), payload,
			map[string]string{MetaPartition: strconv.Itoa(p), MetaKind: "final", MetaJob: job.Encode()})
		if err != nil {
			return out, err
		}
		out = append(out, s)
	}
	return out, nil
}

// ReadRuns returns the final merge's inputs: the partition's run of every
// round, from the slow tier, in round order. A run that is gone (an
// earlier execution merged and deleted them) is ErrConsumed. Copies as
// ReadInputs does.
func ReadRuns(ctx context.Context, job Job, partition int, opts ...Option) ([]Input, error) {
	job = job.withDefaults()
	c, err := setup(ctx, "read runs", opts)
	if err != nil {
		return nil, err
	}
	out := make([]Input, job.Rounds)
	err = each(job.Rounds, min(c.parallel, job.Rounds), func(r int) error {
		key := RunKey(job, partition, r)
		data, obj, err := fetch(ctx, c, ziptrail.TierSlow, key)
		out[r] = Input{Partition: partition, Mapper: fmt.Sprintf("round%d", r), Round: r, Data: data, Tier: ziptrail.TierSlow, Key: key, obj: obj}
		return err
	})
	if err != nil {
		for i := range out {
			out[i].Close()
		}
		return nil, err
	}
	return out, nil
}

// DeleteRuns deletes a partition's runs after its final merge wrote the
// output.
func DeleteRuns(ctx context.Context, job Job, partition int, opts ...Option) (int, error) {
	job = job.withDefaults()
	refs := make([]Ref, job.Rounds)
	for r := range refs {
		refs[r] = Ref{ziptrail.TierSlow, RunKey(job, partition, r)}
	}
	return DeleteRefs(ctx, refs, opts...)
}

// WriteOutput writes a partition's output to the slow tier (OutputKey) and
// sends summary (small: what the collector needs) to the job's output
// bucket, declaring Job.Partitions members for its DynamicJoin.
func WriteOutput(ctx context.Context, job Job, partition int, data, summary []byte, opts ...Option) (*Sent, error) {
	job = job.withDefaults()
	c, err := setup(ctx, "write output", opts)
	if err != nil {
		return nil, err
	}
	if _, err := c.client.TierPut(ctx, ziptrail.TierSlow, OutputKey(job, partition), data, ziptrail.WithSession(c.session)); err != nil {
		return nil, err
	}
	meta := map[string]string{MetaPartition: strconv.Itoa(partition), ziptrail.MetaExpectedCount: strconv.Itoa(job.Partitions), MetaJob: job.Encode()}
	return send(ctx, c, "write output", job.OutputBucket, fmt.Sprintf("%s.out.p%d", job.Name, partition), summary, meta)
}

// ReadOutput reads a partition's output from the slow tier (Close it).
func ReadOutput(ctx context.Context, job Job, partition int, opts ...Option) (*ziptrail.Object, error) {
	c, err := setup(ctx, "read output", opts)
	if err != nil {
		return nil, err
	}
	return c.client.TierGet(ctx, ziptrail.TierSlow, OutputKey(job.withDefaults(), partition), ziptrail.WithSession(c.session))
}

// Done sends this invocation's completion marker to the job's ledger
// bucket (call it last, after every output): the workflow's re-execution
// rules on the ledger re-execute an invocation whose marker is late.
// Outside an invocation it does nothing (nil, nil).
func Done(ctx context.Context, job Job, opts ...Option) (*Sent, error) {
	inv, ok := ziptrail.CurrentInvocation(ctx)
	if !ok {
		return nil, nil
	}
	c, err := setup(ctx, "done", opts)
	if err != nil {
		return nil, err
	}
	return send(ctx, c, "done", job.withDefaults().LedgerBucket, "done."+inv.ID, nil, map[string]string{})
}
