"""Iterative k-means on ziptrail: workers exchange partial sums directly
(allreduce over the sidecars), no store in between.

One program, chosen by the first argument:

  start    the session input (JSON parameters, every one optional; see
           DEFAULTS) -> one object per worker in bucket "shards" (an
           Immediate trigger invokes worker once per object)
  worker   joins the group "kmeans" of its session as its rank of
           `workers`, generates its own shard of the data, and runs Lloyd's
           algorithm with the others: rank 0 picks the initial centroids
           (k-means++ over its shard) and broadcasts them; each iteration
           every worker sums its points per nearest centroid, an allreduce
           SUM adds up the sums and counts of all workers, and every worker
           computes the same new centroids from them. It stops after
           `iterations`, or once no centroid moved more than `tolerance`.
           Rank 0 sends the result to bucket "output" (completes the session)
  local    python3 kmeans.py local ['<params json>']: the same computation
           in one process over the same generated data (no ziptrail, no
           numpy: only Python 3), printing the same JSON

The data: `k` Gaussian blobs (standard deviation SPREAD) around centers
drawn uniformly in [-10, 10]^dims; `points` points in all, split over the
workers in contiguous ranges, worker r drawing its range with its own
random.Random seeded from (seed, r). So the data depend on `seed`, `points`
and `workers`, and `local` with the same parameters sees exactly the same
points.

The result (JSON): the parameters, the final centroids (in the algorithm's
order), the number of iterations run, whether it converged, the inertia
(sum of squared distances of every point to its nearest final centroid,
allreduced), the points per final centroid, the pod (HOSTNAME) of every
rank and the distinct pods, and the seconds the iterations took.
"""

import json
import math
import os
import random
import sys
import time
from array import array

DEFAULTS = {"workers": 4, "k": 5, "dims": 3, "points": 20000, "iterations": 50, "seed": 1, "tolerance": 1e-9}
SPREAD = 1.0
GROUP = "kmeans"
# The worker Service's maxScale in workflow.yaml: more workers than pods
# allowed at once could never all run (see README.md).
MAX_WORKERS = int(os.environ.get("KMEANS_MAX_WORKERS", "16"))
# How long a worker waits for every other worker to join (pods starting),
# and for one collective.
JOIN_TIMEOUT = float(os.environ.get("KMEANS_JOIN_TIMEOUT", "240"))
STEP_TIMEOUT = float(os.environ.get("KMEANS_STEP_TIMEOUT", "120"))


# --- parameters and data ----------------------------------------------------------

def parse_params(raw) -> dict:
    """The parameters: DEFAULTS overridden by a JSON object (bytes or str;
    empty means all defaults)."""
    if isinstance(raw, (bytes, bytearray, memoryview)):
        raw = bytes(raw).decode()
    p = dict(DEFAULTS)
    if raw and raw.strip():
        given = json.loads(raw)
        if not isinstance(given, dict):
            raise ValueError("the parameters are a JSON object")
        unknown = sorted(set(given) - set(DEFAULTS))
        if unknown:
            raise ValueError(f"unknown parameters {unknown} (known: {sorted(DEFAULTS)})")
        p.update(given)
    for name in ("workers", "k", "dims", "points", "iterations", "seed"):
        if not isinstance(p[name], int) or isinstance(p[name], bool):
            raise ValueError(f"{name} must be an integer, got {p[name]!r}")
    if not isinstance(p["tolerance"], (int, float)) or p["tolerance"] < 0:
        raise ValueError(f"tolerance must be a number >= 0, got {p['tolerance']!r}")
    p["tolerance"] = float(p["tolerance"])
    for name in ("workers", "k", "dims", "iterations"):
        if p[name] < 1:
            raise ValueError(f"{name} must be at least 1, got {p[name]}")
    if p["points"] // p["workers"] < p["k"]:
        raise ValueError(f"rank 0 picks the k initial centroids among its points: points/workers "
                         f"({p['points']}/{p['workers']}) must be at least k ({p['k']})")
    return p


def shard_bounds(p: dict, rank: int) -> tuple[int, int]:
    n, w = p["points"], p["workers"]
    return n * rank // w, n * (rank + 1) // w


def blob_centers(p: dict) -> list[list[float]]:
    rng = random.Random(f"kmeans/{p['seed']}/centers")
    return [[rng.uniform(-10.0, 10.0) for _ in range(p["dims"])] for _ in range(p["k"])]


def shard(p: dict, rank: int) -> list[list[float]]:
    """Rank's points, drawn from its own generator (seed, rank)."""
    lo, hi = shard_bounds(p, rank)
    centers = blob_centers(p)
    rng = random.Random(f"kmeans/{p['seed']}/shard/{rank}")
    points = []
    for _ in range(hi - lo):
        c = centers[rng.randrange(len(centers))]
        points.append([x + rng.gauss(0.0, SPREAD) for x in c])
    return points


# --- k-means ---------------------------------------------------------------------

def sqdist(a: list[float], b: list[float]) -> float:
    s = 0.0
    for x, y in zip(a, b):
        t = x - y
        s += t * t
    return s


def nearest(point: list[float], centroids: list[list[float]]) -> tuple[int, float]:
    """The nearest centroid (the lowest index on a tie) and its squared distance."""
    best, best_d = 0, math.inf
    for j, c in enumerate(centroids):
        d = sqdist(point, c)
        if d < best_d:
            best, best_d = j, d
    return best, best_d


def initial_centroids(points: list[list[float]], p: dict) -> list[list[float]]:
    """k-means++ over the given points (rank 0's shard), deterministic in seed."""
    rng = random.Random(f"kmeans/{p['seed']}/init")
    cents = [list(points[rng.randrange(len(points))])]
    d2 = [sqdist(x, cents[0]) for x in points]
    while len(cents) < p["k"]:
        total = sum(d2)
        if total <= 0.0:  # every point is a centroid already
            i = rng.randrange(len(points))
        else:
            target, acc, i = rng.random() * total, 0.0, 0
            for i, d in enumerate(d2):
                acc += d
                if acc > target:
                    break
        cents.append(list(points[i]))
        d2 = [min(d, sqdist(x, cents[-1])) for x, d in zip(points, d2)]
    return cents


def partial_sums(points: list[list[float]], centroids: list[list[float]]) -> array:
    """Per nearest centroid: the sum of the points (k*dims) then their
    counts (k), as one float64 array, the unit the workers allreduce."""
    k, d = len(centroids), len(centroids[0])
    acc = array("d", bytes(8 * (k * d + k)))
    for x in points:
        j, _ = nearest(x, centroids)
        base = j * d
        for i in range(d):
            acc[base + i] += x[i]
        acc[k * d + j] += 1.0
    return acc


def final_stats(points: list[list[float]], centroids: list[list[float]]) -> array:
    """The inertia of the points, then the count per nearest centroid."""
    acc = array("d", bytes(8 * (1 + len(centroids))))
    for x in points:
        j, dist = nearest(x, centroids)
        acc[0] += dist
        acc[1 + j] += 1.0
    return acc


def update(centroids: list[list[float]], sums: array) -> tuple[list[list[float]], float]:
    """New centroids from the summed partial sums (a centroid without points
    stays where it is) and the largest distance a centroid moved."""
    k, d = len(centroids), len(centroids[0])
    new, moved = [], 0.0
    for j, old in enumerate(centroids):
        n = sums[k * d + j]
        c = [sums[j * d + i] / n for i in range(d)] if n > 0 else list(old)
        moved = max(moved, math.sqrt(sqdist(c, old)))
        new.append(c)
    return new, moved


def lloyd(p: dict, centroids: list[list[float]], total_sums, total_stats) -> dict:
    """Lloyd's iterations from the initial centroids. total_sums(centroids)
    is partial_sums over every point (the allreduce of the workers' partial
    sums: the same at every worker, so every worker computes the same
    centroids and stops at the same iteration); total_stats(centroids)
    likewise final_stats."""
    it, converged = 0, False
    start = time.monotonic()
    while it < p["iterations"]:
        centroids, moved = update(centroids, total_sums(centroids))
        it += 1
        if moved <= p["tolerance"]:
            converged = True
            break
    stats = total_stats(centroids)
    return {"centroids": centroids, "iterations": it, "converged": converged, "inertia": stats[0],
            "sizes": [int(c) for c in stats[1:]], "seconds": round(time.monotonic() - start, 3)}


def result(p: dict, run: dict, ranks: list[str]) -> dict:
    return {"params": p, **run, "ranks": ranks, "pods": sorted(set(ranks))}


def pod_name() -> str:
    """This instance's pod: HOSTNAME (Kubernetes sets it to the pod's name)."""
    import socket
    return os.environ.get("HOSTNAME") or socket.gethostname()


def flatten(centroids: list[list[float]]) -> bytes:
    return array("d", [x for c in centroids for x in c]).tobytes()


def unflatten(data, k: int, d: int) -> list[list[float]]:
    a = array("d")
    a.frombytes(bytes(data))
    return [list(a[j * d:(j + 1) * d]) for j in range(k)]


# --- the three modes -----------------------------------------------------------------

def local(p: dict) -> dict:
    """The whole computation in one process over the same data."""
    points = [x for r in range(p["workers"]) for x in shard(p, r)]
    rank0 = points[:shard_bounds(p, 0)[1]]
    run = lloyd(p, initial_centroids(rank0, p),
                lambda cents: partial_sums(points, cents),
                lambda cents: final_stats(points, cents))
    return result(p, run, [pod_name()] * p["workers"])


def run_worker(g, p: dict) -> dict | None:
    """One worker's part over a joined group g (rank g.rank of p["workers"]):
    the result at rank 0, None at the others."""
    import ziptrail
    k, d = p["k"], p["dims"]
    points = shard(p, g.rank)
    mine = flatten(initial_centroids(points, p)) if g.rank == 0 else None
    got = g.broadcast(mine, root=0, timeout=STEP_TIMEOUT)
    try:
        centroids = unflatten(got, k, d)
    finally:
        if got is not mine:
            got.close()
    run = lloyd(p, centroids,
                lambda cents: g.allreduce(partial_sums(points, cents), ziptrail.SUM, timeout=STEP_TIMEOUT),
                lambda cents: g.allreduce(final_stats(points, cents), ziptrail.SUM, timeout=STEP_TIMEOUT))
    pods = g.gather(pod_name().encode(), root=0, timeout=STEP_TIMEOUT)
    if pods is None:
        return None
    return result(p, run, [bytes(x).decode() for x in pods])


def start(inv) -> bytes:
    import ziptrail
    raw = inv.objects[0].bytes() if inv.objects else b""
    p = parse_params(raw)
    if p["workers"] > MAX_WORKERS:
        raise ValueError(f"workers ({p['workers']}) above the worker function's maxScale ({MAX_WORKERS}): "
                         "they could not all run at once")
    for r in range(p["workers"]):
        ziptrail.send_object("shards", f"rank-{r}", json.dumps({"rank": r, "params": p}))
    return b""


def log(msg: str) -> None:
    """Progress on stderr: the container's log (kubectl logs)."""
    print(f"kmeans: {msg}", file=sys.stderr, flush=True)


def worker(inv) -> bytes:
    import ziptrail
    task = json.loads(inv.objects[0].bytes())
    p, rank = task["params"], task["rank"]
    where = f"rank {rank} of {p['workers']} (session {inv.session}, pod {pod_name()})"
    log(f"{where}: joining group {GROUP}")
    try:
        # No leave: the membership ends with this invocation.
        g = ziptrail.join(GROUP, rank, p["workers"], wait_all=True, timeout=JOIN_TIMEOUT)
        log(f"{where}: every rank joined; running")
        out = run_worker(g, p)
    except Exception as e:
        log(f"{where}: failed: {type(e).__name__}: {e}")
        raise
    if out is not None:
        log(f"{where}: {out['iterations']} iterations in {out['seconds']} s, converged {out['converged']}, "
            f"pods {out['pods']}")
        ziptrail.send_object("output", "result", json.dumps(out))
    else:
        log(f"{where}: done")
    return b""


ROLES = {"start": start, "worker": worker}

if __name__ == "__main__":
    if len(sys.argv) in (2, 3) and sys.argv[1] == "local":
        print(json.dumps(local(parse_params(sys.argv[2] if len(sys.argv) == 3 else ""))))
    elif len(sys.argv) == 2 and sys.argv[1] in ROLES:
        import ziptrail
        ziptrail.serve(ROLES[sys.argv[1]])
    else:
        sys.exit(f"usage: kmeans.py {'|'.join(ROLES)} | kmeans.py local ['<params json>']")
