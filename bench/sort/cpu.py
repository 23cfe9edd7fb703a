"""The sort's own CPU cost per byte on one core (the model's Compute,
internal/shuffle/model): what examples/sort's map and merge functions do
besides moving bytes, timed here in one process on examples/sort/records.py
(the same code the functions run).

  map:      generate a slice, checksum it, sort it, partition it, join the
            partitions (sort.py's map_)
  reduce:   merge a partition's sorted pieces from many mappers and join
            them (sort.py's merge and final: records.sort_records)
  validate: the collector's valsort of the output and its sha256 (reported,
            not part of the shuffle)

    python3 cpu.py EXAMPLES_SORT_DIR [--task-bytes 67108864] [--partitions 64] [--repeat 3]

Prints JSON; each cost is the median of --repeat runs. bench/sort runs one
copy per worker at once (each with its own --seed) and takes the median of
their costs: the CPU time per byte a task pays while sharing the cores.
"""

import argparse
import hashlib
import json
import statistics
import sys
import time
import zlib


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("examples")
    ap.add_argument("--task-bytes", type=int, default=64 << 20)
    ap.add_argument("--partitions", type=int, default=64)
    ap.add_argument("--pieces", type=int, default=16, help="mappers whose pieces one reducer merges")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=99)
    a = ap.parse_args()
    sys.path.insert(0, a.examples)
    import records as R

    n = a.task_bytes // R.RECORD
    bounds = R.sample_boundaries(a.seed, n * 64, a.partitions)
    maps, reduces, validates = [], [], []
    for rep in range(a.repeat):
        t0 = time.process_time()
        recs = R.generate_records(a.seed, rep * n, (rep + 1) * n)
        ck = sum(map(zlib.crc32, recs)) & R.MASK64
        recs.sort()
        parts = [b"".join(p) for p in R.partition_sorted(recs, bounds)]
        maps.append((time.process_time() - t0) / (n * R.RECORD))
        del recs, parts, ck
        # a partition of task-bytes/pieces... : pieces sorted slices of one
        # key range, as a reducer gets them from its mappers
        per = n // a.pieces
        pieces = []
        for j in range(a.pieces):
            r = R.generate_records(a.seed + 1, rep * n + j * per, rep * n + (j + 1) * per)
            r.sort()
            pieces.append(b"".join(r))
        t0 = time.process_time()
        out = b"".join(R.sort_records(pieces))
        reduces.append((time.process_time() - t0) / len(out))
        t0 = time.process_time()
        R.validate(out)
        hashlib.sha256(out).hexdigest()
        validates.append((time.process_time() - t0) / len(out))
        del pieces, out
    print(json.dumps({"mapSecondsPerByte": statistics.median(maps), "reduceSecondsPerByte": statistics.median(reduces),
                      "validateSecondsPerByte": statistics.median(validates), "taskBytes": n * R.RECORD,
                      "partitions": a.partitions, "pieces": a.pieces, "repeat": a.repeat,
                      "python": sys.version.split()[0], "samples": {"map": maps, "reduce": reduces, "validate": validates}}))


if __name__ == "__main__":
    main()
