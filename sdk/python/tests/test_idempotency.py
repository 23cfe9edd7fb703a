"""Idempotency keys: the function sees its invocation's key; a duplicate
delivery of the key is answered by the pod's sidecar (a real
queue-proxy-zl) from its record, without running the function again."""

import json
import urllib.request
from pathlib import Path

import ziptrail
from ziptrail.invocation import decode, idempotency_key

CONTENT_TYPE = "application/vnd.ziptrail.invocation+json"


def envelope(invocation: str, attempt: int) -> bytes:
    return json.dumps({"namespace": "ns", "function": "f", "session": "s", "invocation": invocation,
                       "attempt": attempt}).encode()


def post(url: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": CONTENT_TYPE}, method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()


def test_idempotency_key_decoded():
    inv = decode(envelope("s.3", 2))
    assert inv.idempotency_key == "s/s.3/2" == idempotency_key("s", "s.3", 2)
    # The sidecar's key, when it set one, is the one the function gets.
    body = json.loads(envelope("s.3", 2))
    body["idempotencyKey"] = "s/s.3/2"
    assert decode(json.dumps(body).encode()).idempotency_key == "s/s.3/2"
    assert ziptrail.Invocation(namespace="ns", function="f", session="a", id="a.1").idempotency_key == "a/a.1/0"


def test_idempotency_duplicate_answered_from_the_record(sidecars, tmp_path: Path):
    runs = tmp_path / "runs"
    sc = sidecars.start(function=f"""
        def handler(inv):
            with open({str(runs)!r}, "a") as f:
                f.write(inv.idempotency_key + "\\n")
            return ("did " + inv.idempotency_key).encode()
    """)
    first = post(sc.url, envelope("s.3", 2))
    second = post(sc.url, envelope("s.3", 2))
    assert first[0] == second[0] == 200 and first[2] == second[2] == b"did s/s.3/2"
    assert first[1]["ziptrail-idempotency-key"] == "s/s.3/2"
    assert second[1].get("ziptrail-idempotent-replay") == "1" and "ziptrail-idempotent-replay" not in first[1]
    # Another attempt is another key: it runs.
    assert post(sc.url, envelope("s.3", 3))[2] == b"did s/s.3/3"
    assert runs.read_text().split() == ["s/s.3/2", "s/s.3/3"]
