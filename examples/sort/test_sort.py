"""examples/sort's planning without a cluster: a session's ``plan``
parameter is the document ``ziptrail explain -o json`` (or the gateway's
shuffle planner) prints, and the job follows its choice.
Run: PYTHONPATH=sdk/python python -m pytest -q examples/sort
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [HERE, os.path.join(ROOT, "sdk", "python")]

import sort  # noqa: E402


def explain(*args: str, found: bool = True) -> dict:
    """The real planner's answer (`go run ./cmd/ziptrail explain -o json`);
    it exits 1 (still printing the document) when no plan meets the
    objective."""
    out = subprocess.run(["go", "run", "./cmd/ziptrail", "explain", "-o", "json", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert (out.returncode == 0) == found, out.stderr
    return json.loads(out.stdout)


def test_plan_from_explain_picks_method_and_rounds() -> None:
    doc = explain("--size", "256MiB", "--fast-capacity", "64MiB", "--methods", "hybrid")
    chosen = doc["result"]["chosen"]
    job = sort.plan_job({"plan": doc, "bytes": 256 << 20})
    assert job.method == "hybrid"
    assert job.rounds == int(chosen["rounds"]) >= 1


def test_plan_without_a_choice_is_refused() -> None:
    # A deadline nothing meets: explain answers without a chosen plan.
    doc = explain("--size", "4GiB", "--deadline", "1ms", found=False)
    assert "chosen" not in doc["result"], doc["result"]
    with pytest.raises(ValueError, match="no chosen method"):
        sort.plan_job({"plan": doc, "bytes": 16 << 20})
