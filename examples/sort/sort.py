"""Sort on ziptrail (the sort benchmark's records, Locus §5) with the shuffle
library (ziptrail.shuffle): pod memory, Redis, S3 or the multi-round hybrid,
chosen per session.

One program, the function's role as the first argument:

  split    the session input (JSON parameters, see README.md) -> the job:
           range boundaries from a sample of keys, the rounds, and round 0's
           map tasks in bucket "tasks" (Immediate -> map)
  map      one task: generates its slice of the input (records start..stop,
           deterministic from the seed), sorts it, range-partitions it and
           writes every partition with the job's method into "shuffle-r<r>"
           (DynamicGroup per partition -> merge); records its slice's count
           and checksum in the slow tier for the validator
  merge    one partition of a round: hybrid -> one sorted run to S3 and a
           pointer in "runs-r<r>" (DynamicJoin -> next-<r+1>); the other
           methods -> the sorted partition to S3 and a summary in "parts"
           (DynamicJoin -> collect)
  next     after round r (hybrid): round r+1's map tasks into "tasks", or,
           after the last round, one task per partition into "final"
           (Immediate -> final)
  final    one partition: reads its run of every round from S3, merges them
           and writes the partition's output (-> "parts")
  collect  reads every output partition back and validates the whole output
           like valsort (order within and across partitions, record count
           and checksum equal to the input's); the result completes the
           session

Every task sends a marker to "ledger" when it is done: the workflow's
re-execution rules there re-run a task (map, merge, next, final) whose
marker is late.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
import zlib

import records as R
import ziptrail
from ziptrail import shuffle

JOB = "sort"
#: The workflow declares this many hybrid rounds (workflow.yaml, gen_workflow.py).
MAX_ROUNDS = int(os.environ.get("MAX_ROUNDS", "8"))
MiB = 1 << 20


def plan_job(params: dict) -> shuffle.Job:
    """The job from the session's parameters (README.md, "Parameters").
    A ``plan`` (``ziptrail explain -o json``'s output) picks the method and,
    for the hybrid, the rounds."""
    p = dict(params)
    plan = p.pop("plan", None)
    if plan is not None:
        plan = plan.get("result", plan)  # explain -o json (and the gateway's plan) keep the plan under "result"
        chosen = plan.get("chosen") or {}
        cfg = chosen.get("config") or {}
        if not cfg.get("method"):
            raise ValueError("plan: no chosen method (did `ziptrail explain` find a plan within the constraint?)")
        p.setdefault("method", cfg["method"])
        if cfg["method"] == "hybrid" and chosen.get("rounds"):
            p.setdefault("rounds", int(chosen["rounds"]))
    method = p.get("method", "hybrid")
    if "records" in p:
        n = int(p["records"])
    else:
        n = int(p.get("bytes", 16 * MiB)) // R.RECORD
    seed = int(p.get("seed", 1))
    partitions = int(p.get("partitions", 16))
    task_records = int(p.get("taskRecords", max(1, (16 * MiB) // R.RECORD)))
    rounds = 1
    if method == "hybrid":
        if "rounds" in p:
            rounds = int(p["rounds"])
        else:
            fast = int(p.get("fastCapacity", 64 * MiB))
            rounds = max(1, math.ceil(n * R.RECORD / fast))
        if rounds > MAX_ROUNDS:
            raise ValueError(f"{rounds} rounds: the workflow declares at most {MAX_ROUNDS} "
                             "(regenerate it with gen_workflow.py --rounds, or raise fastCapacity)")
    bounds = R.sample_boundaries(seed, n, partitions)
    return shuffle.Job(name=p.get("job", JOB), method=method, partitions=partitions, rounds=rounds,
                       params={"seed": seed, "records": n, "taskRecords": task_records,
                               "bounds": "".join(b.hex() for b in bounds)})


def boundaries(job: shuffle.Job) -> list[bytes]:
    h = job.params["bounds"]
    w = 2 * R.KEY
    return [bytes.fromhex(h[i:i + w]) for i in range(0, len(h), w)]


def map_tasks(job: shuffle.Job, rnd: int) -> list[dict]:
    """Round rnd's map tasks: the round's share of the records, in slices of
    taskRecords (the round's data is ≤ the fast tier's capacity)."""
    n, per = job.params["records"], job.params["taskRecords"]
    a, b = rnd * n // job.rounds, (rnd + 1) * n // job.rounds
    return [{"round": rnd, "mapper": i, "start": s, "stop": min(b, s + per)}
            for i, s in enumerate(range(a, b, per))] or [{"round": rnd, "mapper": 0, "start": a, "stop": a}]


def input_key(job: shuffle.Job, rnd: int, mapper: int) -> str:
    return f"{job.name}/in/r{rnd}/m{mapper}"


def emit(job: shuffle.Job, rnd: int):
    for t in map_tasks(job, rnd):
        yield f"{job.name}.r{rnd}.m{t['mapper']}", json.dumps({"job": job.to_json(), **t})


def session(inv: ziptrail.Invocation) -> str:
    return inv.session


# --- roles ---------------------------------------------------------------------


def split(inv: ziptrail.Invocation) -> bytes:
    raw = inv.objects[0].bytes() if inv.objects else b"{}"
    job = plan_job(json.loads(raw or b"{}"))
    c = ziptrail.default_client()
    for key, payload in emit(job, 0):
        c.send_object(job.tasks_bucket, key, payload, session=inv.session, invocation_id=inv.id)
    shuffle.done(job)
    return b""


def map_(inv: ziptrail.Invocation) -> bytes:
    t = json.loads(inv.objects[0].bytes())
    job = shuffle.Job.from_json(t["job"])
    recs = R.generate_records(job.params["seed"], t["start"], t["stop"])
    c = ziptrail.default_client()
    # The input slice's summary, for the validator (order-independent).
    ck = sum(map(zlib.crc32, recs)) & R.MASK64
    c.tier_put(shuffle.SLOW, inv.session, input_key(job, t["round"], t["mapper"]),
               json.dumps({"records": len(recs), "checksum": f"{ck:016x}"}))
    recs.sort()
    parts = R.partition_sorted(recs, boundaries(job))
    del recs
    shuffle.Writer(job, t["mapper"], t["round"]).write_all([b"".join(p) for p in parts])
    shuffle.done(job)
    return b""


def _sorted_bytes(datas) -> bytes:
    return b"".join(R.sort_records(datas))


def _write(job: shuffle.Job, p: int, out: bytes) -> None:
    shuffle.write_output(job, p, out, json.dumps({"partition": p, "records": len(out) // R.RECORD}))


def merge(inv: ziptrail.Invocation) -> bytes:
    job = shuffle.job_of(inv.objects)
    p = shuffle.partition_of(inv.group)
    if job.method == "hybrid":
        shuffle.round_merge(job, inv.objects, _sorted_bytes, partition=p)
    else:
        try:
            inputs = shuffle.read_inputs(inv.objects)
        except shuffle.Consumed:  # re-executed after writing: send what is there
            with shuffle.read_output(job, p) as out:
                _write(job, p, bytes(out))
        else:
            out = _sorted_bytes([i.data for i in inputs])
            for i in inputs:
                i.close()
            _write(job, p, out)
            del out
            shuffle.cleanup(inputs)
    shuffle.done(job)
    return b""


def next_(inv: ziptrail.Invocation) -> bytes:
    job = shuffle.job_of(inv.objects)
    rnd = shuffle.round_of_runs(inv.objects)
    shuffle.next_round(job, rnd, lambda r: emit(job, r), lambda p: json.dumps({"partition": p}))
    shuffle.done(job)
    return b""


def final(inv: ziptrail.Invocation) -> bytes:
    job = shuffle.job_of(inv.objects)
    p = json.loads(inv.objects[0].bytes())["partition"]
    try:
        runs = shuffle.read_runs(job, p)
    except shuffle.Consumed:
        with shuffle.read_output(job, p) as out:
            _write(job, p, bytes(out))
    else:
        out = _sorted_bytes([r.data for r in runs])  # a k-way merge of the sorted runs
        for r in runs:
            r.close()
        _write(job, p, out)
        del out
        shuffle.delete_runs(job, p)
    shuffle.done(job)
    return b""


def validate_job(job: shuffle.Job, sess: str, client: ziptrail.Client | None = None, cleanup: bool = True) -> dict:
    """valsort of the job's output: every partition read back from the slow
    tier, in order; the count and checksum compared with the input's (the
    mappers' summaries)."""
    c = client or ziptrail.default_client()
    t0 = time.monotonic()
    parts, digest, size = [], hashlib.sha256(), 0
    for p in range(job.partitions):
        with shuffle.read_output(job, p, session=sess, client=c) as out:
            parts.append(R.validate(out))
            digest.update(out)
            size += len(out)
    total = R.combine(parts)
    want_n, want_ck, inputs = 0, 0, []
    for r in range(job.rounds):
        for t in map_tasks(job, r):
            key = input_key(job, r, t["mapper"])
            with c.tier_get(shuffle.SLOW, sess, key) as d:
                s = json.loads(bytes(d))
            want_n += s["records"]
            want_ck += int(s["checksum"], 16)
            inputs.append(key)
    want_ck &= R.MASK64
    ok = total.sorted and total.records == want_n == job.params["records"] and total.checksum == want_ck
    if cleanup:
        shuffle.cleanup([(shuffle.SLOW, k) for k in inputs], session=sess, client=c)
    return {"valid": ok, "method": job.method, "rounds": job.rounds, "partitions": job.partitions,
            "records": total.records, "bytes": size, "checksum": f"{total.checksum:016x}",
            "inputRecords": want_n, "inputChecksum": f"{want_ck:016x}", "sorted": total.sorted,
            "unsortedAt": total.unsorted_at, "duplicateKeys": total.duplicates, "sha256": digest.hexdigest(),
            "partitionRecords": [s.records for s in parts], "validateSeconds": round(time.monotonic() - t0, 3)}


def collect(inv: ziptrail.Invocation) -> bytes:
    job = shuffle.job_of(inv.objects)
    result = validate_job(job, inv.session)
    ziptrail.send_object("output", "result", json.dumps(result))
    return b""


ROLES = {"split": split, "map": map_, "merge": merge, "next": next_, "final": final, "collect": collect}


def main(argv: list[str]) -> None:
    if len(argv) == 2 and argv[1] in ROLES:
        ziptrail.serve(ROLES[argv[1]])
    elif len(argv) == 4 and argv[1] == "expected":
        # the input's summary, computed here: expected SEED RECORDS
        s = R.expected(int(argv[2]), int(argv[3]))
        print(json.dumps({"records": s.records, "checksum": f"{s.checksum:016x}"}))
    else:
        sys.exit(f"usage: sort.py {'|'.join(ROLES)} | sort.py expected SEED RECORDS")


if __name__ == "__main__":
    main(sys.argv)
