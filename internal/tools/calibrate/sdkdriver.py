"""The Python SDK's side of calibrate's sidecar-path points (sdkpython.go).

Run by `ziptrail calibrate` with the python of the SDK's environment:
``python3 sdkdriver.py SOCKET_A SHM_A SOCKET_B SHM_B``. It reads one JSON
command a line on stdin, does it with the real ``ziptrail.Client`` (on pod
a's sidecar; pulls on pod b's), and answers one JSON line on stdout with
its own CPU time (``time.process_time``: every thread of this process)
and wall time. Calibrate reads the sidecars' and the server's CPU around
each command, so every command is one timed batch: ``workers`` threads,
each ``count`` objects of ``size`` bytes (``prefix`` names the keys).

- ``tier_put``, ``tier_get``, ``tier_delete`` (``tier``: "slow" or
  "fast"): the gets copy each object out of the shared memory and close
  it, as ``shuffle.read_inputs`` does;
- ``put``: into pod a's own store (a producer's side); the references are
  kept for the next command,
- ``get``: pod b pulls them from a over the data plane (used in place, as
  pod-memory inputs are), or ``free``: a reads them back (untimed);
- ``exit``.

The answer: ``{"cpu": s, "seconds": s, "requests": n, "bytes": b}`` or
``{"error": "..."}``.
"""

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import ziptrail


def main() -> None:
    sock_a, shm_a, sock_b, shm_b = sys.argv[1:5]
    a = ziptrail.Client(sock_a, shm_a)
    b = ziptrail.Client(sock_b, shm_b)
    session = "calibrate"
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "exit":
            break
        try:
            out = run(cmd, a, b, session)
        except Exception as e:  # reported, the caller fails the point
            out = {"error": f"{type(e).__name__}: {e}"}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


#: references a put into pod a, until a "get" (b pulls them) or a "free" (a reads them back)
_refs: list[list[str]] = []


def run(cmd: dict, a: "ziptrail.Client", b: "ziptrail.Client", session: str) -> dict:
    global _refs
    op, size, count, workers = cmd["op"], int(cmd.get("size", 0)), int(cmd.get("count", 0)), int(cmd.get("workers", 1))
    data = os.urandom(size)
    keys = [[f"{cmd.get('prefix', 'py')}-{w}-{i}" for i in range(count)] for w in range(workers)]
    tier = cmd.get("tier", "slow")
    if op == "put":
        _refs = [[] for _ in range(workers)]

    def timed(w: int) -> None:
        if op == "tier_put":
            for k in keys[w]:
                a.tier_put(tier, session, k, data)
        elif op == "tier_get":
            for k in keys[w]:
                d = a.tier_get(tier, session, k)
                if not isinstance(d, bytes):  # copied out and released, as shuffle.read_inputs does
                    c = bytes(d)
                    d.close()
                    d = c
                if len(d) != size:
                    raise RuntimeError(f"got {len(d)} bytes, put {size}")
        elif op == "tier_delete":
            a.tier_delete(tier, session, keys[w])
        elif op == "put":
            _refs[w].extend(a.put(data, 1, session=session) for _ in range(count))
        elif op in ("get", "free"):
            for ref in _refs[w]:
                d = (b if op == "get" else a).get(ref)
                if len(d) != size:
                    raise RuntimeError(f"got {len(d)} bytes, put {size}")
                getattr(d, "close", lambda: None)()
        else:
            raise ValueError(f"unknown op {op!r}")

    cpu0, t0 = time.process_time(), time.monotonic()
    with ThreadPoolExecutor(workers) as ex:
        list(ex.map(timed, range(workers)))
    seconds, cpu = time.monotonic() - t0, time.process_time() - cpu0
    if op in ("get", "free"):
        _refs = []
    return {"cpu": cpu, "seconds": seconds, "requests": workers * count, "bytes": float(workers * count * size)}


if __name__ == "__main__":
    main()
