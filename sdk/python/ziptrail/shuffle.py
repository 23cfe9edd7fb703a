"""Shuffle library for MapReduce-style jobs (Locus, NSDI '19, §3), on top of
DynamicGroup: a partition is a group.

A job (:class:`Job`) names itself, its storage method and its number of
partitions. Mappers write partition ``p`` of their output with
:class:`Writer`; the workflow's DynamicGroup trigger on the round's
shuffle bucket (``shuffle-r<round>``, group metadata ``group=p<p>``) invokes
one reducer per partition once every mapper finished; the reducer reads its
inputs with :func:`read_inputs` (whatever the method) and frees them with
:func:`cleanup`. The methods (docs/shuffle.md compares them; ``ziptrail
explain`` predicts which is fastest or cheapest for a size):

``podmemory``
    The partition is the shuffle bucket's object itself
    (``send_object``): the bytes stay in the mapper's pod, the reducer's
    sidecar pulls them directly when it resolves the invocation.
``redis`` / ``s3``
    The partition goes to the fast (Redis) / slow (S3) tier with
    ``TierPut`` under :func:`tier_key` (``<job>/r<round>/p<p>/m<mapper>``,
    scoped by the sidecar to the namespace and the session), and a small
    pointer object (JSON) with the same group goes into the shuffle bucket.
    The reducer resolves pointers with ``TierGet``.
``hybrid``
    Locus's multi-round shuffle (§3.4, Fig. 3): the input is processed in
    rounds of at most the fast tier's capacity. In round r, mappers write
    their partitions to the fast tier (as ``redis``); a DynamicGroup on
    ``shuffle-r<r>`` invokes one round merge per partition
    (:func:`round_merge`), which combines the round's pieces into one
    sorted run written to the slow tier (:func:`run_key`) and frees the
    fast tier; a DynamicJoin on ``runs-r<r>`` over the round's partitions
    invokes the next-round function (:func:`next_round`), which emits the
    next round's map tasks or, after the last round, one final-merge task
    per partition; the final merge (:func:`read_runs`) reads that
    partition's runs from S3 and merges them.

Objects are sent through the sidecar (``SendObject``, tagged with the
invocation), so large partitions are never copied into the function's
response, and the trigger engine counts them before the mapper counts as
finished (the DynamicGroup does not close early).

Re-execution: every stage is idempotent. Keys are deterministic, so a
re-executed mapper overwrites the same tier keys with the same bytes and
its objects (same keys) are deduplicated by the engine; a re-executed merge
whose inputs were already consumed finds its output in the slow tier and
sends it again (:class:`Consumed`). :func:`done` sends the per-invocation
marker that a workflow's re-execution rules watch (see docs/shuffle.md,
"Re-execution"), so each task is re-executed on its own when it fails or
hangs.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Sequence

from . import server
from .bucket import META_EXPECTED_COUNT, META_GROUP, Sent
from .client import BytesLike, Client, Data, default_client
from .errors import InvalidError, NotFoundError, ZiptrailError

METHODS = ("podmemory", "redis", "s3", "hybrid")
FAST, SLOW = "fast", "slow"

#: Metadata of the shuffle bucket's objects.
META_KIND = "zt-shuffle"     # "data" (podmemory) or "pointer"
META_MAPPER = "zt-mapper"
META_PARTITION = "zt-partition"
META_ROUND = "zt-round"
META_JOB = "zt-job"          # the Job (JSON), on every object a stage receives
#: A pointer object's JSON carries this field.
POINTER_VERSION = "zt-shuffle-pointer"

#: Bucket names the workflow declares (overridable per job).
TASKS_BUCKET = "tasks"
FINAL_BUCKET = "final"
OUTPUT_BUCKET = "parts"
SHUFFLE_PREFIX = "shuffle-r"
RUNS_PREFIX = "runs-r"
LEDGER_BUCKET = "ledger"


@dataclass(frozen=True)
class Job:
    """One shuffle job of a session.

    ``name`` makes the job's keys unique in the session (letters, digits,
    '-', '_', '.'); ``partitions`` is the number of reducers (groups
    ``p0`` .. ``p<partitions-1>``); ``rounds`` is the hybrid's number of
    rounds (1 for the other methods); ``params`` is the application's own
    configuration, carried with the job through every stage."""

    name: str
    method: str
    partitions: int
    rounds: int = 1
    params: dict[str, Any] = field(default_factory=dict)
    tasks_bucket: str = TASKS_BUCKET
    final_bucket: str = FINAL_BUCKET
    output_bucket: str = OUTPUT_BUCKET
    shuffle_prefix: str = SHUFFLE_PREFIX
    runs_prefix: str = RUNS_PREFIX
    ledger_bucket: str = LEDGER_BUCKET

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise InvalidError("shuffle", f"method {self.method!r}: one of {', '.join(METHODS)}")
        if not self.name or any(not (c.isalnum() or c in "-_.") for c in self.name):
            raise InvalidError("shuffle", f"job name {self.name!r}: letters, digits, '-', '_' and '.' only")
        if self.partitions < 1:
            raise InvalidError("shuffle", f"partitions must be at least 1, got {self.partitions}")
        if self.rounds < 1 or (self.rounds > 1 and self.method != "hybrid"):
            raise InvalidError("shuffle", f"rounds {self.rounds}: at least 1, and more than 1 only for hybrid")

    @property
    def tier(self) -> str | None:
        """Where the mappers' partitions go: a tier, or None (pod memory)."""
        return {"redis": FAST, "s3": SLOW, "hybrid": FAST}.get(self.method)

    def shuffle_bucket(self, round: int = 0) -> str:
        return f"{self.shuffle_prefix}{round}"

    def runs_bucket(self, round: int) -> str:
        return f"{self.runs_prefix}{round}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def encode(self) -> str:
        """Compact JSON, as carried in the ``zt-job`` metadata."""
        return json.dumps(self.to_json(), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, d: dict[str, Any] | str | bytes) -> Job:
        if not isinstance(d, dict):
            d = json.loads(d)
        return cls(**d)


def job_of(objects: Iterable[Any]) -> Job:
    """The job of a stage's input objects (their ``zt-job`` metadata)."""
    for o in objects:
        if META_JOB in o.metadata:
            return Job.from_json(o.metadata[META_JOB])
    raise InvalidError("shuffle", "no input object names its shuffle job (zt-job metadata)")


def group(partition: int) -> str:
    """The DynamicGroup group of a partition."""
    return f"p{partition}"


def partition_of(group_name: str) -> int:
    if not group_name.startswith("p") or not group_name[1:].isdigit():
        raise InvalidError("shuffle", f"group {group_name!r} is not a shuffle partition (p<n>)")
    return int(group_name[1:])


def tier_key(job: Job, round: int, partition: int, mapper: int | str) -> str:
    """The tier key of mapper's piece of a partition in a round."""
    return f"{job.name}/r{round}/p{partition}/m{mapper}"


def object_key(job: Job, round: int, partition: int, mapper: int | str) -> str:
    """The shuffle bucket's object key of that piece."""
    return f"{job.name}.r{round}.p{partition}.m{mapper}"


def run_key(job: Job, partition: int, round: int) -> str:
    """The slow-tier key of a partition's sorted run of a round (hybrid)."""
    return f"{job.name}/run/p{partition}/r{round}"


def output_key(job: Job, partition: int) -> str:
    """The slow-tier key of a partition's output (:func:`write_output`)."""
    return f"{job.name}/out/p{partition}"


def _context(session: str | None, client: Client | None) -> tuple[str, Client]:
    if session is None:
        inv = server.current_invocation()
        if inv is None:
            raise InvalidError("shuffle", "outside a function invocation: pass session=")
        session = inv.session
    return session, client or default_client()


def _invocation_id() -> str:
    inv = server.current_invocation()
    return inv.id if inv is not None else ""


def _send(bucket: str, key: str, data: BytesLike, metadata: dict[str, str], session: str, client: Client,
          invocation_id: str | None = None) -> Sent:
    """Sends through the sidecar (SendObject), never in the response: no
    copy of a large piece, and the object is tagged with the invocation
    (the engine counts it before the invocation counts as finished). Pass
    ``invocation_id`` from the handler's thread when sending from others."""
    if invocation_id is None:
        invocation_id = _invocation_id()
    r = client.send_object(bucket, key, data, session=session, metadata=metadata, invocation_id=invocation_id)
    return Sent(bucket, key, r.size, "sidecar", r.ref, r.persisted)


# --- mapper side ---------------------------------------------------------------


class Writer:
    """Writes a mapper's partitions for one round of a job.

    ``mapper`` names the mapper (unique in the round: its task number);
    ``session`` and ``client`` default to the running invocation's."""

    def __init__(self, job: Job, mapper: int | str, round: int = 0, *, session: str | None = None,
                 client: Client | None = None) -> None:
        if not 0 <= round < job.rounds:
            raise InvalidError("shuffle", f"round {round} of a job of {job.rounds}")
        self.job, self.mapper, self.round = job, str(mapper), round
        self.session, self.client = _context(session, client)
        self.invocation_id = _invocation_id()
        self._job = job.encode()
        self.sent: list[Sent] = []
        #: the metadata sent with each object, by object key
        self.metadata: dict[str, dict[str, str]] = {}

    def write(self, partition: int, data: BytesLike) -> Sent:
        """Writes this mapper's piece of ``partition`` (empty pieces too:
        every partition must exist as a group)."""
        job = self.job
        if not 0 <= partition < job.partitions:
            raise InvalidError("shuffle", f"partition {partition} of {job.partitions}")
        meta = {META_GROUP: group(partition), META_MAPPER: self.mapper, META_PARTITION: str(partition),
                META_ROUND: str(self.round), META_JOB: self._job}
        okey = object_key(job, self.round, partition, self.mapper)
        bucket = job.shuffle_bucket(self.round)
        tier = job.tier
        if tier is None:
            meta[META_KIND] = "data"
            s = _send(bucket, okey, data, meta, self.session, self.client, self.invocation_id)
        else:
            key = tier_key(job, self.round, partition, self.mapper)
            size = self.client.tier_put(tier, self.session, key, data)
            meta[META_KIND] = "pointer"
            ptr = json.dumps({POINTER_VERSION: 1, "tier": tier, "key": key, "size": size, "mapper": self.mapper,
                              "partition": partition, "round": self.round}).encode()
            s = _send(bucket, okey, ptr, meta, self.session, self.client, self.invocation_id)
        self.sent.append(s)
        self.metadata[okey] = meta
        return s

    def write_all(self, parts: Sequence[BytesLike], parallel: int = 4) -> list[Sent]:
        """Writes every partition (``len(parts) == job.partitions``),
        ``parallel`` at a time."""
        if len(parts) != self.job.partitions:
            raise InvalidError("shuffle", f"{len(parts)} parts for {self.job.partitions} partitions")
        with ThreadPoolExecutor(max(1, parallel)) as ex:
            return list(ex.map(lambda p: self.write(p, parts[p]), range(len(parts))))


# --- reducer side --------------------------------------------------------------


@dataclass
class Input:
    """One piece of a partition: ``data`` supports the buffer protocol
    (a zero-copy view for pod-memory pieces, the mapped tier object for
    pointers). ``tier``/``key`` name where a pointer's bytes were (None
    for pod memory), for :func:`cleanup`."""

    partition: int
    mapper: str
    round: int
    data: Any
    tier: str | None = None
    key: str | None = None

    def close(self) -> None:
        c = getattr(self.data, "close", None)
        if c is not None and self.tier is not None:
            try:
                c()
            except BufferError:
                pass  # views of it are still alive: the GC releases it


class Consumed(ZiptrailError):
    """A pointer's tier object is gone: an earlier execution of this task
    consumed (and deleted) it. The caller checks for its own output."""

    kind = "Consumed"


def _is_pointer(obj: Any) -> bool:
    return obj.metadata.get(META_KIND) == "pointer"


def _fetch(c: Client, tier: str, session: str, key: str, copy: bool) -> Any:
    """TierGet; with ``copy``, the bytes are copied out of the pod's shared
    memory and the object's file released at once."""
    d = c.tier_get(tier, session, key)
    if not copy or isinstance(d, bytes):
        return d
    try:
        return bytes(d)
    finally:
        d.close()


def read_inputs(objects: Iterable[Any], *, session: str | None = None, client: Client | None = None,
                parallel: int = 4, copy: bool = True) -> list[Input]:
    """Every input of a reducer, whatever the method: ``objects`` are the
    invocation's (``inv.objects``, the group's shuffle objects). Pod-memory
    pieces are used as they came (the sidecar pulled them); pointers are
    resolved with ``TierGet``, ``parallel`` at a time. Sorted by (round,
    mapper). Raises :class:`Consumed` when a pointed-to object is gone.

    ``copy`` (default) copies each fetched piece out of the pod's shared
    memory right away: a pod's ``/dev/shm`` is small (64 MiB by default on
    Kubernetes and on the local cluster) and a mapped object holds its
    pages there until it is closed, so concurrent large reads would fill it
    (ENOSPC). ``copy=False`` keeps the zero-copy mapping (close the inputs
    as soon as possible)."""
    objs = list(objects)
    todo = [o for o in objs if _is_pointer(o)]
    out: list[Input] = []
    for o in objs:
        if not _is_pointer(o):
            m = o.metadata
            out.append(Input(int(m.get(META_PARTITION, "-1")), m.get(META_MAPPER, o.key), int(m.get(META_ROUND, "0")),
                             o.data))
    if todo:
        session, c = _context(session, client)
        ptrs = []
        for o in todo:
            try:
                p = json.loads(bytes(o.data))
            except ValueError as e:
                raise InvalidError("shuffle", f"{o.bucket}/{o.key}: not a shuffle pointer: {e}") from None
            if not isinstance(p, dict) or p.get(POINTER_VERSION) != 1:
                raise InvalidError("shuffle", f"{o.bucket}/{o.key}: not a shuffle pointer")
            ptrs.append(p)

        def fetch(p: dict) -> Input:
            try:
                d = _fetch(c, p["tier"], session, p["key"], copy)
            except NotFoundError:
                raise Consumed("shuffle", f"{p['tier']} tier key {p['key']} is gone (consumed earlier?)") from None
            return Input(p["partition"], str(p["mapper"]), p["round"], d, p["tier"], p["key"])

        with ThreadPoolExecutor(max(1, min(parallel, len(ptrs)))) as ex:
            out += list(ex.map(fetch, ptrs))
    out.sort(key=lambda i: (i.round, _natural(i.mapper)))
    return out


def _natural(s: str) -> tuple[int, str]:
    return (int(s), "") if s.isdigit() else (1 << 62, s)


def cleanup(inputs: Iterable[Input] | Iterable[tuple[str, str]], *, session: str | None = None,
            client: Client | None = None) -> int:
    """Deletes the tier objects of consumed inputs (``Input``s, or
    ``(tier, key)`` pairs); pod-memory pieces are freed by their bucket's
    GC. Returns the number of keys deleted."""
    by_tier: dict[str, list[str]] = {}
    for i in inputs:
        tier, key = (i.tier, i.key) if isinstance(i, Input) else i
        if tier is not None and key is not None:
            by_tier.setdefault(tier, []).append(key)
    if not by_tier:
        return 0
    session, c = _context(session, client)
    for tier, keys in by_tier.items():
        for a in range(0, len(keys), 256):
            c.tier_delete(tier, session, keys[a:a + 256])
    return sum(len(k) for k in by_tier.values())


# --- hybrid stages ---------------------------------------------------------------


def round_merge(job: Job, objects: Iterable[Any], combine: Callable[[list[Any]], BytesLike], *,
                partition: int | None = None, session: str | None = None, client: Client | None = None) -> Sent:
    """A hybrid round's merge for one partition (the DynamicGroup target of
    ``shuffle-r<r>``): reads the round's pieces from the fast tier,
    ``combine`` (the pieces' data, in mapper order) makes the sorted run,
    which is written to the slow tier under :func:`run_key`; a pointer goes
    to ``runs-r<r>``, declaring ``job.partitions`` members for the
    DynamicJoin; then the fast tier's pieces are deleted."""
    objs = list(objects)
    if not objs:
        raise InvalidError("round_merge", "no inputs")
    m = objs[0].metadata
    rnd = int(m.get(META_ROUND, "0"))
    p = partition if partition is not None else int(m[META_PARTITION])
    session, c = _context(session, client)
    key = run_key(job, p, rnd)
    try:
        inputs = read_inputs(objs, session=session, client=c)
    except Consumed:
        # An earlier execution consumed the pieces: its run must be there.
        try:
            run = c.tier_get(SLOW, session, key)
        except NotFoundError:
            raise ZiptrailError("round_merge", f"round {rnd} partition {p}: inputs consumed and no run {key}") from None
        size = len(run)
        run.close()
        return _send_run(job, p, rnd, key, size, session, c)
    try:
        run = combine([i.data for i in inputs])
        size = c.tier_put(SLOW, session, key, run)
        del run
    finally:
        for i in inputs:
            i.close()
    sent = _send_run(job, p, rnd, key, size, session, c)
    cleanup(inputs, session=session, client=c)
    return sent


def _send_run(job: Job, p: int, rnd: int, key: str, size: int, session: str, client: Client) -> Sent:
    ptr = json.dumps({POINTER_VERSION: 1, "tier": SLOW, "key": key, "size": size, "mapper": f"round{rnd}",
                      "partition": p, "round": rnd}).encode()
    meta = {META_KIND: "run", META_PARTITION: str(p), META_ROUND: str(rnd), META_EXPECTED_COUNT: str(job.partitions),
            META_JOB: job.encode()}
    return _send(job.runs_bucket(rnd), f"{job.name}.run.r{rnd}.p{p}", ptr, meta, session, client)


def round_of_runs(objects: Iterable[Any]) -> int:
    """The round whose runs a next-round invocation received."""
    rounds = {int(o.metadata[META_ROUND]) for o in objects if META_ROUND in o.metadata}
    if len(rounds) != 1:
        raise InvalidError("next_round", f"inputs of rounds {sorted(rounds)}: expected one round's runs")
    return rounds.pop()


def next_round(job: Job, finished: int, emit: Callable[[int], Iterable[tuple[str, BytesLike]]],
               final: Callable[[int], BytesLike], *, session: str | None = None,
               client: Client | None = None) -> list[Sent]:
    """After round ``finished``: sends round ``finished+1``'s map tasks
    (``emit(round)`` yields (key, payload) pairs) to the tasks bucket, or,
    after the last round, one final-merge task per partition
    (``final(partition)``'s payload, key ``<job>.final.p<p>``) to the
    final bucket."""
    session, c = _context(session, client)
    nxt = finished + 1
    out = []
    if nxt < job.rounds:
        for key, payload in emit(nxt):
            out.append(_send(job.tasks_bucket, key, payload, {META_ROUND: str(nxt), META_JOB: job.encode()}, session, c))
    else:
        for p in range(job.partitions):
            out.append(_send(job.final_bucket, f"{job.name}.final.p{p}", final(p),
                             {META_PARTITION: str(p), META_KIND: "final", META_JOB: job.encode()}, session, c))
    return out


def read_runs(job: Job, partition: int, *, session: str | None = None, client: Client | None = None,
              parallel: int = 4, copy: bool = True) -> list[Input]:
    """The final merge's inputs: the partition's run of every round, from
    the slow tier, in round order. Raises :class:`Consumed` when a run is
    gone (an earlier execution merged and deleted them). ``copy``: as for
    :func:`read_inputs`."""
    session, c = _context(session, client)

    def fetch(r: int) -> Input:
        key = run_key(job, partition, r)
        try:
            return Input(partition, f"round{r}", r, _fetch(c, SLOW, session, key, copy), SLOW, key)
        except NotFoundError:
            raise Consumed("read_runs", f"run {key} is gone (consumed earlier?)") from None

    with ThreadPoolExecutor(max(1, min(parallel, job.rounds))) as ex:
        return list(ex.map(fetch, range(job.rounds)))


def delete_runs(job: Job, partition: int, *, session: str | None = None, client: Client | None = None) -> int:
    """Deletes a partition's runs after its final merge wrote the output."""
    return cleanup([(SLOW, run_key(job, partition, r)) for r in range(job.rounds)], session=session, client=client)


def write_output(job: Job, partition: int, data: BytesLike, summary: BytesLike = b"", *,
                 session: str | None = None, client: Client | None = None) -> Sent:
    """Writes a partition's output to the slow tier (:func:`output_key`)
    and sends ``summary`` (small: what the collector needs) to the job's
    output bucket, declaring ``job.partitions`` members for its
    DynamicJoin."""
    session, c = _context(session, client)
    c.tier_put(SLOW, session, output_key(job, partition), data)
    meta = {META_PARTITION: str(partition), META_EXPECTED_COUNT: str(job.partitions), META_JOB: job.encode()}
    return _send(job.output_bucket, f"{job.name}.out.p{partition}", summary, meta, session, c)


def read_output(job: Job, partition: int, *, session: str | None = None, client: Client | None = None) -> Data:
    """A partition's output from the slow tier."""
    session, c = _context(session, client)
    return c.tier_get(SLOW, session, output_key(job, partition))


def done(job: Job, *, session: str | None = None, client: Client | None = None) -> Sent | None:
    """Sends this invocation's completion marker to the job's ledger bucket
    (call it last, after every output): the workflow's re-execution rules
    on the ledger re-execute an invocation whose marker is late. Outside an
    invocation it does nothing."""
    inv = server.current_invocation()
    if inv is None:
        return None
    session, c = _context(session, client)
    return _send(job.ledger_bucket, f"done.{inv.id}", b"", {}, session, c, inv.id)
