"""The function server's own idempotency records (docs/guarantees.md): a
delivery whose key the pod's sidecar put in the envelope runs the handler
at most once per function process, whatever happened to the sidecar that
delivered it. Real processes: function servers (``ziptrail.serve``) and
queue-proxy-zl sidecars, one of them SIGKILLed mid-call."""

from __future__ import annotations

import base64
import json
import os
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

CONTENT_TYPE = "application/vnd.ziptrail.invocation+json"
OUTPUTS = "application/vnd.ziptrail.outputs+json"
REPLAYED = "ziptrail-idempotent-replay"

# The function: writes one line per run of its handler (the side effect
# that must happen once per key), can block until a gate file exists, and
# answers with what only this run can know (its run number).
FUNCTION = """
import os, time

RUNS, GATE = {runs!r}, {gate!r}

def handler(inv):
    with open(RUNS, "a") as f:
        f.write(inv.idempotency_key + "\\n")
    n = len(open(RUNS).read().split())
    if inv.args == b"block":
        while not os.path.exists(GATE):
            time.sleep(0.01)
    if inv.args == b"fail":
        raise RuntimeError("failed in run %d" % n)
    if inv.args == b"input":
        return inv.objects[0].data  # a view of the mapped input file
    if inv.args == b"plain":
        return "run %d of %s" % (n, inv.idempotency_key)
    ziptrail.send_object("out", "o", b"sent by run %d" % n, metadata={{"run": str(n)}})
    return ("run %d of %s" % (n, inv.idempotency_key)).encode()
"""


class Fn:
    def __init__(self, tmp: Path) -> None:
        self.runs, self.gate = tmp / "runs", tmp / "gate"
        self.runs.write_text("")

    def source(self) -> str:
        return FUNCTION.format(runs=str(self.runs), gate=str(self.gate))

    def ran(self) -> list[str]:
        return self.runs.read_text().split()

    def wait_running(self, n: int = 1) -> None:
        deadline = time.monotonic() + 30
        while len(self.ran()) < n:
            assert time.monotonic() < deadline, f"the handler did not start ({self.ran()})"
            time.sleep(0.01)

    def release(self) -> None:
        self.gate.write_text("go")


def envelope(invocation: str = "s.1", attempt: int = 0, *, keyed: bool = True, args: bytes = b"",
             objects: list | None = None) -> bytes:
    env = {"namespace": "ns", "function": "f", "session": "s", "invocation": invocation, "attempt": attempt,
           "args": base64.b64encode(args).decode()}
    if keyed:  # as the pod's sidecar sets it
        env["idempotencyKey"] = f"s/{invocation}/{attempt}"
    if objects:
        env["objects"] = objects
    return json.dumps(env).encode()


def post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": CONTENT_TYPE, **(headers or {})}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def same_answer(a: tuple[int, dict[str, str], bytes], b: tuple[int, dict[str, str], bytes]) -> bool:
    return (a[0], a[1].get("content-type"), a[2]) == (b[0], b[1].get("content-type"), b[2])


@pytest.fixture
def fn(sidecars, tmp_path: Path):
    """A function server process (``ziptrail.serve``), called straight on
    its port as the pod's sidecar calls it."""
    f = Fn(tmp_path)
    shm = tmp_path / "objects"
    shm.mkdir()
    f.shm = shm
    f.url = f"http://127.0.0.1:{sidecars.function(f.source(), {'ZIPTRAIL_SHM_DIR': str(shm)})}/"
    return f


def test_a_key_runs_once_and_its_answer_is_replayed(fn):
    first = post(fn.url, envelope("s.1"))
    second = post(fn.url, envelope("s.1"))
    assert first[0] == 200 and first[1]["content-type"] == OUTPUTS
    outs = json.loads(first[2])
    assert base64.b64decode(outs["return"]) == b"run 1 of s/s.1/0"
    assert [(o["bucket"], o["key"], base64.b64decode(o["inline"]), o["metadata"]) for o in outs["objects"]] == [
        ("out", "o", b"sent by run 1", {"run": "1"})]
    assert same_answer(first, second), (first, second)
    assert REPLAYED not in first[1] and second[1].get(REPLAYED) == "1"
    # A plain answer (no outputs) is replayed the same way.
    plain = [post(fn.url, envelope("s.2", args=b"plain")) for _ in range(2)]
    assert plain[0][2] == b"run 2 of s/s.2/0" and same_answer(*plain)
    assert fn.ran() == ["s/s.1/0", "s/s.2/0"]


def test_concurrent_deliveries_of_a_key_run_once(fn):
    answers: list = [None, None]

    def deliver(i: int) -> None:
        answers[i] = post(fn.url, envelope("s.1", args=b"block"))

    threads = [threading.Thread(target=deliver, args=(i,)) for i in range(2)]
    threads[0].start()
    fn.wait_running()
    threads[1].start()
    time.sleep(0.5)  # the second delivery waits for the running one (no way to see it from here)
    assert answers == [None, None], "an answer before the handler was released"
    fn.release()
    for t in threads:
        t.join(60)
    assert answers[0][0] == 200 and same_answer(answers[0], answers[1]), answers
    assert [a[1].get(REPLAYED) for a in answers] == [None, "1"]
    assert fn.ran() == ["s/s.1/0"]


def test_another_attempt_or_no_key_runs_again(fn):
    assert post(fn.url, envelope("s.1", 2))[0] == 200
    assert post(fn.url, envelope("s.1", 3))[0] == 200  # a re-execution: another key
    # Without the sidecar's key in the envelope (a request straight to the
    # function's port), nothing is recorded, even with the dispatcher's
    # header: the key the function honours is the one its sidecar derived.
    for _ in range(2):
        answer = post(fn.url, envelope("s.9", keyed=False), {"Ziptrail-Idempotency-Key": "s/s.9/0"})
        assert answer[0] == 200 and REPLAYED not in answer[1]
    assert fn.ran() == ["s/s.1/2", "s/s.1/3", "s/s.9/0", "s/s.9/0"]


def test_a_failure_is_an_answer_too(fn):
    first, second = (post(fn.url, envelope("s.1", args=b"fail")) for _ in range(2))
    assert first[0] == 500 and b"failed in run 1" in first[2] and same_answer(first, second)
    assert fn.ran() == ["s/s.1/0"]


def test_a_replay_does_not_depend_on_the_inputs(fn):
    """The handler answers with a view of its mapped input; the sidecar
    removes the input file after the answer. The recorded answer is a copy:
    a replay needs neither the file nor the mapping (and the resend's
    inputs are not opened at all)."""
    data = os.urandom(200_000)
    name = "in-" + uuid.uuid4().hex
    (fn.shm / name).write_bytes(data)
    obj = {"bucket": "b", "key": "k", "size": len(data), "path": name}
    first = post(fn.url, envelope("s.1", args=b"input", objects=[obj]))
    assert first[0] == 200 and first[2] == data, first[:2]
    (fn.shm / name).unlink()  # as the sidecar does once the answer passed
    again = post(fn.url, envelope("s.1", args=b"input", objects=[dict(obj, path="in-" + uuid.uuid4().hex)]))
    assert same_answer(first, again) and again[1].get(REPLAYED) == "1"
    # A path the sidecar cannot have given is refused all the same.
    foreign = post(fn.url, envelope("s.1", args=b"input", objects=[dict(obj, path="../objects/" + name)]))
    assert foreign[0] == 400 and b"not a name the pod's sidecar gives" in foreign[2], foreign
    assert fn.ran() == ["s/s.1/0"]


def outputs(answer: tuple[int, dict[str, str], bytes]) -> tuple[bytes, list]:
    assert answer[0] == 200 and answer[1]["content-type"] == OUTPUTS, answer
    outs = json.loads(answer[2])
    return base64.b64decode(outs["return"]), [(o["bucket"], o["key"], base64.b64decode(o["inline"])) for o in outs["objects"]]


def test_a_sidecar_killed_mid_call_does_not_run_the_key_again(sidecars, tmp_path: Path):
    """The chaos checker's kill-queue-proxy: the sidecar dies while the
    handler runs, the handler finishes (its effect happens) and its answer
    is lost with the sidecar; the dispatcher resends the key to the
    restarted sidecar, which has no record and forwards it. The function
    process runs it once, and the resend gets the first run's answer."""
    f = Fn(tmp_path)
    sc = sidecars.start(function=f.source())
    lost: list = []

    def first() -> None:
        try:
            lost.append(post(sc.url, envelope("s.1", args=b"block")))
        except OSError as e:  # the sidecar died with the call
            lost.append(e)

    t = threading.Thread(target=first)
    t.start()
    f.wait_running()
    sc = sidecars.restart(sc)  # SIGKILL, then a new queue-proxy-zl on the same ports
    t.join(30)
    assert lost and isinstance(lost[0], OSError), lost

    # The resend while the first run still goes on: it waits for it.
    resent: list = []
    t = threading.Thread(target=lambda: resent.append(post(sc.url, envelope("s.1", args=b"block"))))
    t.start()
    time.sleep(0.5)
    assert not resent
    f.release()
    t.join(60)
    want = (b"run 1 of s/s.1/0", [("out", "o", b"sent by run 1")])
    assert outputs(resent[0]) == want
    assert resent[0][1]["ziptrail-idempotency-key"] == "s/s.1/0"
    # Once it finished: a sidecar restarted again has no record either.
    sc = sidecars.restart(sc)
    again = post(sc.url, envelope("s.1", args=b"block"))
    assert outputs(again) == want and again[1].get(REPLAYED) == "1"
    assert f.ran() == ["s/s.1/0"], "the handler ran again for one key"


# --- the records' bounds (in process) ---------------------------------------

class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def answer(body: bytes) -> tuple[int, str, bytes]:
    return 200, "application/octet-stream", body


def test_records_bounds():
    from ziptrail._idempotency import Records

    clock = Clock()
    r = Records(max_keys=3, max_bytes=1000, max_answer=400, ttl=600, clock=clock)

    def run(key: str, body: bytes) -> None:
        rec, mine = r.begin(key)
        assert mine, f"{key} is recorded"
        r.finish(rec, answer(body))

    def recorded(key: str):
        rec = r._keys.get(key)
        return rec.wait() if rec is not None else None

    for k in "abc":
        run(k, b"x" * 10)
    assert recorded("a") == answer(b"x" * 10)
    run("d", b"y")  # a fourth key: the oldest (a) goes
    assert recorded("a") is None and recorded("b") is not None
    assert r.usage()[0] == 3
    # Bytes: 3 answers of 200 (+ 88 for status and content type) fit, a
    # fourth evicts the oldest.
    r = Records(max_keys=100, max_bytes=1000, max_answer=400, ttl=600, clock=clock)
    for k in "pqrs":
        run(k, b"z" * 200)
    assert recorded("p") is None and all(recorded(k) is not None for k in "qrs")
    assert r.usage()[1] <= 1000
    # An answer over the per-answer cap is not recorded: the key runs again.
    run("big", b"b" * 401)
    assert recorded("big") is None
    # ...but a delivery that waited for it gets it.
    rec, _ = r.begin("big2")
    waiter, mine = r.begin("big2")
    assert not mine
    r.finish(rec, answer(b"b" * 401))
    assert waiter.wait() == answer(b"b" * 401)
    assert recorded("big2") is None
    # Running keys are never evicted (their duplicates wait for them).
    r = Records(max_keys=2, max_bytes=1000, max_answer=400, ttl=600, clock=clock)
    running = [r.begin(k)[0] for k in "uvw"]
    assert not r.begin("u")[1] and r.usage()[0] == 3
    for rec in running:
        r.finish(rec, answer(b"."))
    assert r.usage()[0] == 2 and recorded("u") is None and recorded("v") is not None and recorded("w") is not None
    # TTL: ten minutes after it finished.
    run("t", b"t")
    clock.t += 599
    assert not r.begin("t")[1], "recorded for ten minutes"
    clock.t += 2
    assert r.begin("t")[1], "expired"
    # An abandoned run (the handler never answered) wakes its waiters,
    # who may run the key themselves.
    rec, _ = r.begin("gone")
    waiter, _ = r.begin("gone")
    r.abandon(rec)
    assert waiter.wait() is None
    assert r.begin("gone")[1]


def host_address() -> str:
    """An address of this host other than loopback (the source of its
    default route), where a server on all interfaces is reached as from
    another pod."""
    import socket

    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("198.51.100.1", 9))  # no packet is sent: only the route is looked up
        addr = s.getsockname()[0]
    finally:
        s.close()
    assert not addr.startswith("127."), "this host has no address but loopback: the test needs one"
    return addr


def test_only_the_pods_sidecar_is_answered_from_a_record(fn):
    """The function's port is reachable from any pod at the pod's IP: a
    caller there who forges another invocation's key (its format is public)
    must not read that invocation's recorded answer. Only requests over the
    loopback interface (the pod's sidecar) use the records; one from
    elsewhere runs the handler and records nothing."""
    outside = fn.url.replace("127.0.0.1", host_address())
    secret = post(fn.url, envelope("s.1", args=b"plain"))
    forged = post(outside, envelope("s.1", args=b"plain"))
    assert REPLAYED not in forged[1] and not same_answer(forged, secret), (forged, secret)
    post(outside, envelope("s.2", args=b"plain"))
    assert REPLAYED not in post(fn.url, envelope("s.2", args=b"plain"))[1], "a run from outside the pod was recorded"
    again = post(fn.url, envelope("s.1", args=b"plain"))
    assert again[1].get(REPLAYED) == "1" and same_answer(again, secret)
    assert fn.ran() == ["s/s.1/0", "s/s.1/0", "s/s.2/0", "s/s.2/0"]
