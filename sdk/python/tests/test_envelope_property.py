"""Property tests of the function server's envelope decoding (hypothesis):
whatever body arrives, ``decode`` either returns a well-typed invocation
or raises :class:`ziptrail.InvalidError` naming the cause, and it never
reads a file the sidecar did not place."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ziptrail
from ziptrail.invocation import decode

PLACED = "in-" + "ab" * 16  # the one input "the sidecar placed"
SYMLINK = "in-" + "cd" * 16  # a symlink with a sidecar-like name
SECRETS = (b"SECRET-IN-DIR", b"SECRET-OUTSIDE")


@pytest.fixture(scope="module")
def shm(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("objects")
    outside = tmp_path_factory.mktemp("outside") / "token"
    outside.write_bytes(b"SECRET-OUTSIDE")
    (d / PLACED).write_bytes(b"PLACED-INPUT")
    (d / "put-1").write_bytes(b"SECRET-IN-DIR")
    os.symlink(outside, d / SYMLINK)
    return str(d)


json_scalars = st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | \
    st.floats(allow_nan=False) | st.text(max_size=20)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4) |
                           st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
b64 = st.binary(max_size=16).map(lambda b: base64.b64encode(b).decode())
paths = st.sampled_from([PLACED, SYMLINK, "put-1", "/etc/hostname", "../x", PLACED + "/x", ".", "..", "",
                         "in-" + "0" * 32]) | st.text(max_size=40)
# Values that are sometimes right, often of the wrong type.
maybe = lambda good: good | json_values  # noqa: E731
objects = st.fixed_dictionaries({}, optional={
    "bucket": maybe(st.sampled_from(["b", ""])), "key": maybe(st.sampled_from(["k", ""])),
    "size": maybe(st.integers(min_value=-5, max_value=2**64)), "ref": maybe(st.sampled_from(["zt1.x", ""])),
    "inline": maybe(b64 | st.sampled_from(["", "eA", "not base64!", "eA==\n"])), "path": maybe(paths),
    "metadata": maybe(st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3)),
})
envelopes = st.fixed_dictionaries(
    {"function": maybe(st.just("f")), "session": maybe(st.just("s")), "invocation": maybe(st.just("i"))},
    optional={"namespace": maybe(st.just("ns")), "workflow": maybe(st.just("w")), "trigger": maybe(st.just("t")),
              "group": maybe(st.just("g")), "attempt": maybe(st.integers(min_value=-(2**64), max_value=2**64)),
              "args": maybe(b64), "objects": maybe(st.lists(maybe(objects), max_size=4))})


def check(body: bytes, shm: str) -> None:
    try:
        inv = decode(body, shm)
    except ziptrail.InvalidError as e:
        assert str(e)  # a reason, for the 400
        return
    try:
        for name in ("namespace", "workflow", "function", "session", "id", "trigger", "group"):
            assert isinstance(getattr(inv, name), str)
        assert inv.function and inv.session and inv.id
        assert isinstance(inv.attempt, int) and not isinstance(inv.attempt, bool)
        assert isinstance(inv.args, bytes)
        env = json.loads(body)
        for o, raw in zip(inv.objects, env.get("objects") or [], strict=True):
            data = bytes(o.data)
            assert o.size == len(data)
            assert all(isinstance(k, str) and isinstance(v, str) for k, v in o.metadata.items())
            if raw.get("inline") is not None:
                assert data == base64.b64decode(raw["inline"])  # inline bytes come first
            else:
                assert raw.get("path") == PLACED and data == b"PLACED-INPUT", (raw, data)
            assert not any(s in data for s in SECRETS)
    finally:
        inv.close()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(envelopes)
def test_envelopes_decode_or_fail_with_a_reason(shm, env):
    check(json.dumps(env).encode(), shm)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(json_values)
def test_any_json_decodes_or_fails_with_a_reason(shm, value):
    check(json.dumps(value).encode(), shm)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=200) | st.sampled_from([b"[" * 100_000, b'{"a":' * 50_000, b"\xff\xfe{}", b"NaN"]))
def test_any_bytes_decode_or_fail_with_a_reason(shm, body):
    check(body, shm)


def test_placed_input_is_mapped(shm):
    inv = decode(json.dumps({"function": "f", "session": "s", "invocation": "i",
                             "objects": [{"bucket": "b", "key": "k", "path": PLACED, "ref": "zt1.x"}]}).encode(), shm)
    try:
        assert bytes(inv.objects[0].data) == b"PLACED-INPUT"
    finally:
        inv.close()


def test_files_written_stay_in_place(shm):
    """decode never removes or changes files (the sidecar owns them)."""
    assert sorted(os.listdir(shm)) == sorted([PLACED, SYMLINK, "put-1"])
    assert Path(shm, PLACED).read_bytes() == b"PLACED-INPUT"
