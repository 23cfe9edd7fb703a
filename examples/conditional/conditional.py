"""Conditional branch on ziptrail (ByName): a classifier writes its decision
under one of two keys, and a ByName trigger per key runs only that branch.

One program, three functions, chosen by the first argument:

  classify  the session input (a payment as JSON) -> the payment under key
            "approve" or "review" in bucket "decisions"
  approve   runs only for key "approve" -> the approval in bucket "output"
  review    runs only for key "review" -> a review case in bucket "output"
"""

import json
import sys

import ziptrail

LIMIT = 500.0
SANCTIONED = {"XX"}


def classify(inv: ziptrail.Invocation) -> bytes:
    payment = json.loads(inv.objects[0].bytes())
    reasons = []
    if payment["amount"] > LIMIT:
        reasons.append(f"amount above {LIMIT:g}")
    if payment.get("country") in SANCTIONED:
        reasons.append("sanctioned country")
    payment["reasons"] = reasons
    ziptrail.send_object("decisions", "review" if reasons else "approve", json.dumps(payment))
    return b""


def approve(inv: ziptrail.Invocation) -> bytes:
    payment = json.loads(inv.objects[0].bytes())
    ziptrail.send_object("output", "result", json.dumps({"id": payment["id"], "decision": "approved"}))
    return b""


def review(inv: ziptrail.Invocation) -> bytes:
    payment = json.loads(inv.objects[0].bytes())
    ziptrail.send_object("output", "result", json.dumps(
        {"id": payment["id"], "decision": "manual review", "reasons": payment["reasons"]}))
    return b""


ROLES = {"classify": classify, "approve": approve, "review": review}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ROLES:
        sys.exit(f"usage: conditional.py {'|'.join(ROLES)}")
    ziptrail.serve(ROLES[sys.argv[1]])
