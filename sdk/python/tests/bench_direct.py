"""Ping-pong between two Python member processes, each on its own real
sidecar (queue-proxy-zl on the operator's control server): one-way latency
(round trip / 2) of the same-node direct channel against the sidecar path.
Not part of the test suite (not a test_*.py file); run it explicitly:

    python -m pytest -q -s sdk/python/tests/bench_direct.py

Arms: "direct" (both pods on one node: a direct channel each way),
"sidecars" (pods on two nodes: attached members, messages through both
sidecars). With ZIPTRAIL_BENCH_SDK_REF=<git ref> both run again with that
revision's Python SDK (e.g. the one before direct channels, whose members
do not attach: the sidecar path in both). Prints p50/p90/p99 per arm and size, and the load average.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from conftest import REPO, SDK, Pods, Sidecar

MEMBER = r'''
import sys, time
import ziptrail
sock, shm, session, rank, n, size = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
c = ziptrail.Client(sock, shm)
g = c.join(session, "pp", rank, 2, wait_all=True, timeout=120)
msg = b"x" * size
warm = max(20, n // 10)
rtts = []
for i in range(warm + n):
    if rank == 0:
        t0 = time.perf_counter_ns()
        g.send(1, msg)
        with g.recv(source=1) as m:
            assert len(m.data) == size
        if i >= warm:
            rtts.append(time.perf_counter_ns() - t0)
    else:
        with g.recv(source=0) as m:
            assert len(m.data) == size
        g.send(0, msg)
g.barrier()
g.leave()
if rank == 0:
    rtts.sort()
    q = lambda p: rtts[min(len(rtts) - 1, int(p * len(rtts)))] / 2000
    print(f"RESULT {q(0.5):.1f} {q(0.9):.1f} {q(0.99):.1f} direct={getattr(g, '_att', None) is not None}")
'''

CASES = [(64, 5000), (64 << 10, 2000), (1 << 20, 300)]


def pingpong(a: Sidecar, b: Sidecar, session: str, size: int, n: int, sdk: Path, tmp: Path) -> str:
    script = tmp / "member.py"
    script.write_text(MEMBER)
    env = dict(os.environ, PYTHONPATH=str(sdk))
    procs = [subprocess.Popen([sys.executable, str(script), sc.socket, sc.shm_dir, session, str(r), str(n), str(size)],
                              env=env, stdout=subprocess.PIPE, text=True) for r, sc in enumerate((a, b))]
    out = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), out
    return next(line for line in out[0].splitlines() if line.startswith("RESULT")).split(" ", 1)[1]


def test_bench_pingpong(pods: Pods, tmp_path: Path):
    arms = {"direct": (pods.start(node="n1"), pods.start(node="n1"), SDK),
            "sidecars": (pods.start(node="n1"), pods.start(node="n2"), SDK)}
    ref = os.environ.get("ZIPTRAIL_BENCH_SDK_REF")
    if ref:
        old = Path(tempfile.mkdtemp(dir=tmp_path))
        subprocess.run(f"git archive {ref} sdk/python/ziptrail | tar -x -C {old}", shell=True, cwd=REPO, check=True)
        for arm in ("direct", "sidecars"):  # the same pods, that revision's SDK
            arms[f"{arm}, SDK of {ref}"] = (arms[arm][0], arms[arm][1], old / "sdk" / "python")
    rounds = int(os.environ.get("ZIPTRAIL_BENCH_ROUNDS", "1"))
    sizes = [int(x) for x in os.environ.get("ZIPTRAIL_BENCH_SIZES", "").split(",") if x]
    print(f"\nload average before: {os.getloadavg()}")
    print(f"{'arm':32} {'size':>8} {'p50 us':>8} {'p90 us':>8} {'p99 us':>8}  (rounds interleaved: {rounds})")
    for size, n in CASES:
        if sizes and size not in sizes:
            continue
        for rnd in range(rounds):
            for i, (arm, (a, b, sdk)) in enumerate(arms.items()):
                res = pingpong(a, b, f"bench-{size}-{i}-{rnd}", size, n, sdk, tmp_path)
                p50, p90, p99, _ = res.split()
                print(f"{arm:32} {size:>8} {p50:>8} {p90:>8} {p99:>8}")
    print(f"load average after: {os.getloadavg()}")
