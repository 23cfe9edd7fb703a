package main

import (
	"context"
	"encoding/json"
	"syscall"
	"time"

	"github.com/ziptrail/ziptrail/internal/engine"
	"github.com/ziptrail/ziptrail/internal/operator/sessions"
)

// Checkpoint is what the buckets' checkpoints held at the end of a case.
// Since incremental checkpoints (290e480), a bucket's snapshot holds its
// running sessions and is saved when something changed (at most once a
// second); each ended session is a record written once, fenced, and kept
// for the retention (an hour) in the bucket's ended hash.
type Checkpoint struct {
	Buckets           int     `json:"buckets"`
	Bytes             int64   `json:"bytes"`              // all buckets' snapshots together
	RegistrySessions  int     `json:"registry_sessions"`  // in the snapshots: the gateway's view of running sessions
	EngineSessions    int     `json:"engine_sessions"`    // running in the engine
	Tombstones        int     `json:"tombstones"`         // ended sessions the engine's snapshot still names
	BytesPerSession   float64 `json:"bytes_per_session"`  // Bytes / RegistrySessions
	EncodeNsPerByte   float64 `json:"encode_ns_per_byte"` // json.Marshal of the decoded snapshot: CPU time of this (unpinned) process
	EncodeSampleBytes int64   `json:"encode_sample_bytes"`
	// EndedRecords and EndedBytes: the ended sessions' records kept, and
	// the Redis memory they take with their expiry index (MEMORY USAGE).
	EndedRecords        int64   `json:"ended_records"`
	EndedBytes          int64   `json:"ended_bytes"`
	BytesPerEndedRecord float64 `json:"bytes_per_ended_record"`
}

// state mirrors the orchestrator's checkpoint (internal/operator/orchestrator
// checkpoint.go) with the same engine and registry types.
type state struct {
	Engine   *engine.Snapshot           `json:"engine"`
	Sessions []sessions.Session         `json:"sessions"`
	Results  map[string]json.RawMessage `json:"results,omitempty"`
	Triggers json.RawMessage            `json:"triggers,omitempty"`
}

func (c *cluster) measureCheckpoint(ctx context.Context, prefix string) Checkpoint {
	var cp Checkpoint
	var largest *state
	for key, n := range c.checkpointSizes(ctx, prefix) {
		data, err := c.redis.Client.HGet(ctx, key, "data").Bytes()
		if err != nil {
			continue
		}
		var st state
		if json.Unmarshal(data, &st) != nil || st.Engine == nil {
			continue
		}
		cp.Buckets++
		cp.Bytes += n
		cp.RegistrySessions += len(st.Sessions)
		cp.EngineSessions += len(st.Engine.Sessions)
		cp.Tombstones += len(st.Engine.Tombstones)
		if int64(len(data)) > cp.EncodeSampleBytes {
			cp.EncodeSampleBytes, largest = int64(len(data)), &st
		}
	}
	cp.EndedRecords, cp.EndedBytes = c.endedRecords(ctx, prefix)
	if cp.EndedRecords > 0 {
		cp.BytesPerEndedRecord = float64(cp.EndedBytes) / float64(cp.EndedRecords)
	}
	if cp.RegistrySessions > 0 {
		cp.BytesPerSession = float64(cp.Bytes) / float64(cp.RegistrySessions)
	}
	if largest != nil && cp.EncodeSampleBytes > 0 {
		// As the owner's save does each second (its engine snapshot's deep
		// copies of running sessions aside: few, next to the ended ones).
		// CPU time, not wall time: the machine is shared (the load has
		// stopped, so this process does little else meanwhile).
		cpu0, rounds := selfCPUTime(), 0
		for selfCPUTime()-cpu0 < 300*time.Millisecond || rounds < 3 {
			if _, err := json.Marshal(largest); err != nil {
				break
			}
			rounds++
		}
		cp.EncodeNsPerByte = float64((selfCPUTime() - cpu0).Nanoseconds()) / float64(rounds) / float64(cp.EncodeSampleBytes)
	}
	return cp
}

// selfCPUTime is this process's CPU time (every thread, the garbage
// collector's too), at microsecond resolution.
func selfCPUTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
