"""The peer of bench/sort: Ray (from PyPI, hack/ray-venv.sh) sorting the same
records as examples/sort with Ray's own shuffle: a map/reduce of Ray tasks
whose partitions go through Ray's object store (spilling to local disk past
its memory), under the same memory cap as ziptrail's fast tier
(--object-store-memory) and the machine's cores (--num-cpus).

It runs examples/sort's code (records.py: generator, sample boundaries,
partitioning, merge, valsort): map tasks of --task-records records generate,
checksum, sort and partition their slice (one object per partition, Ray's
num_returns); one reduce task per partition merges its pieces; the driver
then reads the partitions in order and validates them like examples/sort's
collector (order, record count, checksum against the mappers' summaries,
sha256 of the whole output).

    python ray_sort.py EXAMPLES_SORT_DIR --seed S --records N --partitions R
                       --task-records T --object-store-memory BYTES [--num-cpus 2]

Prints one JSON line: initSeconds (ray.init and warm workers, not counted), sortSeconds
(first map submitted → every reduce finished), validateSeconds, seconds
(the two together), and the validator's report.
"""

import argparse
import hashlib
import json
import os
import sys
import time
import zlib


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("examples")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--records", type=int, required=True)
    ap.add_argument("--partitions", type=int, required=True)
    ap.add_argument("--task-records", type=int, required=True)
    ap.add_argument("--object-store-memory", type=int, required=True)
    ap.add_argument("--num-cpus", type=int, default=2)
    a = ap.parse_args()
    sys.path.insert(0, a.examples)
    os.environ["PYTHONPATH"] = a.examples + os.pathsep + os.environ.get("PYTHONPATH", "")
    import ray
    import records as R

    # Ray's smallest object store is 75 MiB (only a smoke run's cap is below it).
    store = max(a.object_store_memory, 75 * 1024 * 1024)
    t = time.monotonic()
    ray.init(num_cpus=a.num_cpus, object_store_memory=store, include_dashboard=False,
             logging_level="WARNING", log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]}})
    P = a.partitions

    @ray.remote
    def warm():
        import records  # noqa: F401  (the workers' imports, as a warm pod has them)
        return os.getpid()

    # Start the workers before the clock starts (ziptrail's pods are warm too).
    ray.get([warm.remote() for _ in range(4 * a.num_cpus)])
    init = time.monotonic() - t

    @ray.remote(num_returns=P + 1)
    def map_task(seed, start, stop, bounds):
        import records as R
        recs = R.generate_records(seed, start, stop)
        ck = sum(map(zlib.crc32, recs)) & R.MASK64
        recs.sort()
        parts = R.partition_sorted(recs, bounds)
        return [(len(recs), ck)] + [b"".join(p) for p in parts]

    @ray.remote
    def reduce_task(*pieces):
        import records as R
        return b"".join(R.sort_records(pieces))

    t0 = time.monotonic()
    bounds = R.sample_boundaries(a.seed, a.records, P)
    maps = [map_task.remote(a.seed, s, min(a.records, s + a.task_records), bounds)
            for s in range(0, a.records, a.task_records)]
    summaries = [m[0] for m in maps]
    reduces = [reduce_task.remote(*[m[1 + p] for m in maps]) for p in range(P)]
    del maps
    ray.wait(reduces, num_returns=len(reduces), fetch_local=False)
    sort_s = time.monotonic() - t0

    t1 = time.monotonic()
    parts, digest, size = [], hashlib.sha256(), 0
    for p in range(P):
        out = ray.get(reduces[p])
        parts.append(R.validate(out))
        digest.update(out)
        size += len(out)
        reduces[p] = None
        del out
    total = R.combine(parts)
    want_n, want_ck = 0, 0
    for n, ck in ray.get(summaries):
        want_n += n
        want_ck += ck
    want_ck &= R.MASK64
    val_s = time.monotonic() - t1
    ok = total.sorted and total.records == want_n == a.records and total.checksum == want_ck
    ray.shutdown()
    print(json.dumps({"valid": ok, "sorted": total.sorted, "records": total.records, "bytes": size,
                      "checksum": f"{total.checksum:016x}", "inputRecords": want_n, "inputChecksum": f"{want_ck:016x}",
                      "sha256": digest.hexdigest(), "partitions": P, "initSeconds": round(init, 3),
                      "sortSeconds": round(sort_s, 3), "validateSeconds": round(val_s, 3),
                      "seconds": round(sort_s + val_s, 3), "ray": ray.__version__,
                      "objectStoreMemory": store, "numCpus": a.num_cpus}))


if __name__ == "__main__":
    main()
