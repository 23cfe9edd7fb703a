"""The k-means example without a cluster: `kmeans.py local`, and the
workers' code (run_worker) as members of an in-memory group (the SDK's test
stand-in for the sidecars, sdk/python/tests/fakesidecar.py), checked
against local. Run: PYTHONPATH=sdk/python python -m pytest -q examples/kmeans
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from typing import Any

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [HERE, os.path.join(ROOT, "sdk", "python"), os.path.join(ROOT, "sdk", "python", "tests")]

import kmeans  # noqa: E402
from fakesidecar import Hub  # noqa: E402

LIMIT = 120  # seconds: a bound against hangs, never a timing assertion


def run_group(p: dict, pods: int, inline_threshold: int) -> list[Any]:
    """Every rank's run_worker in its own thread, rank r on pod r % pods."""
    hub = Hub(inline_threshold=inline_threshold)
    members = [hub.pod() for _ in range(pods)]
    n = p["workers"]
    out: list[Any] = [None] * n

    def member(r: int) -> None:
        try:
            with members[r % pods].client.join("sess", kmeans.GROUP, r, n, wait_all=True, timeout=LIMIT) as g:
                out[r] = kmeans.run_worker(g, p)
        except BaseException as e:  # noqa: BLE001 - checked below
            out[r] = e

    threads = [threading.Thread(target=member, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(LIMIT)
        assert not t.is_alive(), "a member hung"
    try:
        for r, v in enumerate(out):
            if isinstance(v, BaseException):
                raise AssertionError(f"rank {r} failed: {v!r}") from v
        for m in members:
            assert m.files() == [], "a message file was left behind"
    finally:
        hub.close()
    return out


def canonical(centroids: list[list[float]]) -> list[list[float]]:
    return sorted(centroids)


def assert_same(got: dict, want: dict) -> None:
    """Equal up to the order of floating-point additions."""
    assert got["iterations"] == want["iterations"]
    assert got["converged"] == want["converged"]
    assert got["sizes"] == want["sizes"]
    assert got["inertia"] == pytest.approx(want["inertia"], rel=1e-9)
    for a, b in zip(canonical(got["centroids"]), canonical(want["centroids"]), strict=True):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("params, pods, inline_threshold", [
    ({"workers": 4, "points": 4000}, 2, 256),                   # small messages inline
    ({"workers": 3, "k": 8, "dims": 8, "points": 3000}, 3, 256),  # a partial sum is a shared-memory file
    ({"workers": 1, "points": 1000}, 1, 256),
])
def test_workers_over_a_group_compute_what_local_does(params: dict, pods: int, inline_threshold: int):
    p = kmeans.parse_params(json.dumps(params))
    want = kmeans.local(p)
    out = run_group(p, pods, inline_threshold)
    assert all(v is None for v in out[1:])
    got = out[0]
    assert_same(got, want)
    assert got["params"] == p
    assert len(got["ranks"]) == p["workers"]


def test_local_command_prints_the_result():
    """The command the README and the e2e spec run, with plain python3 (no SDK)."""
    params = {"workers": 2, "k": 3, "dims": 2, "points": 600, "seed": 7}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, os.path.join(HERE, "kmeans.py"), "local", json.dumps(params)],
                         capture_output=True, text=True, check=True, env=env, timeout=LIMIT).stdout
    got = json.loads(out)
    assert got == {**kmeans.local(kmeans.parse_params(json.dumps(params))), "seconds": got["seconds"]}
    assert len(got["centroids"]) == 3 and all(len(c) == 2 for c in got["centroids"])
    assert sum(got["sizes"]) == 600
    assert 1 <= got["iterations"] <= got["params"]["iterations"]


@pytest.mark.parametrize("raw, message", [
    ('{"workers": 0}', "workers must be at least 1"),
    ('{"k": 2.5}', "k must be an integer"),
    ('{"colour": 1}', "unknown parameters"),
    ('{"workers": 4, "points": 10, "k": 5}', "must be at least k"),
    ("[1]", "JSON object"),
])
def test_bad_parameters(raw: str, message: str):
    with pytest.raises(ValueError, match=message):
        kmeans.parse_params(raw)


def test_shards_are_deterministic_and_partition_the_points():
    p = kmeans.parse_params('{"workers": 3, "points": 1000}')
    shards = [kmeans.shard(p, r) for r in range(3)]
    assert [len(s) for s in shards] == [333, 333, 334]
    assert kmeans.shard(p, 1) == shards[1]
    assert shards[0] != shards[1]
