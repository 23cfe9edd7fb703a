"""Dynamic map on ziptrail (DynamicJoin): the input decides how many parallel
tasks run, and the join waits for exactly that many results.

One program, three functions, chosen by the first argument:

  fanout  the session input (one number per line) -> one task per number in
          bucket "tasks", each carrying how many tasks there are (an
          Immediate trigger invokes count once per task)
  count   one task n -> the number of primes below n in bucket "results",
          declaring the expected count (ziptrail.expected-count) for the join
  merge   every result (a DynamicJoin trigger fires once the declared set
          is complete) -> {n: primes below n} in bucket "output"
"""

import json
import math
import sys

import ziptrail


def fanout(inv: ziptrail.Invocation) -> bytes:
    numbers = [int(line) for line in inv.objects[0].bytes().decode().split() if line]
    if not numbers:
        raise ValueError("the input must hold at least one number")
    for i, n in enumerate(numbers):
        ziptrail.send_object("tasks", f"task-{i:04d}", str(n), metadata={"tasks": str(len(numbers))})
    return b""


def primes_below(n: int) -> int:
    if n < 3:
        return 0
    sieve = bytearray([1]) * n
    sieve[0:2] = b"\x00\x00"
    for p in range(2, math.isqrt(n - 1) + 1):
        if sieve[p]:
            sieve[p * p::p] = bytearray(len(range(p * p, n, p)))
    return sum(sieve)


def count(inv: ziptrail.Invocation) -> bytes:
    task = inv.objects[0]
    n = int(task.bytes())
    ziptrail.send_object("results", task.key, json.dumps([n, primes_below(n)]),
                         metadata={"ziptrail.expected-count": task.metadata["tasks"]})
    return b""


def merge(inv: ziptrail.Invocation) -> bytes:
    results = dict(json.loads(o.bytes()) for o in inv.objects)
    ziptrail.send_object("output", "result", json.dumps({str(n): results[n] for n in sorted(results)}))
    return b""


ROLES = {"fanout": fanout, "count": count, "merge": merge}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ROLES:
        sys.exit(f"usage: dynamicmap.py {'|'.join(ROLES)}")
    ziptrail.serve(ROLES[sys.argv[1]])
