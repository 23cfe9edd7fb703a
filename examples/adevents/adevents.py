"""Ad-event stream on ziptrail (Immediate, then ByTime): every event is
enriched as soon as it arrives, and a time window aggregates what arrived.

One program, three functions, chosen by the first argument:

  ingest     the session input (JSON lines of ad events) -> one object per
             event in bucket "events" (an Immediate trigger invokes enrich
             once per event, at once)
  enrich     one event -> the event with its campaign and price in bucket
             "enriched" (a ByTime trigger collects them for WINDOW)
  aggregate  every event of the window -> per-campaign impressions, clicks,
             click-through rate and spend in bucket "output"
"""

import json
import sys

import ziptrail

# The lookup enrich does; in production a feature store or a cache.
ADS = {
    "ad-1": {"campaign": "spring-sale", "cpc": 0.40, "cpm": 2.0},
    "ad-2": {"campaign": "spring-sale", "cpc": 0.35, "cpm": 1.5},
    "ad-3": {"campaign": "new-phone", "cpc": 1.10, "cpm": 6.0},
}


def ingest(inv: ziptrail.Invocation) -> bytes:
    for i, line in enumerate(inv.objects[0].bytes().decode().splitlines()):
        if line.strip():
            json.loads(line)  # reject malformed input here, not downstream
            ziptrail.send_object("events", f"event-{i:05d}", line)
    return b""


def enrich(inv: ziptrail.Invocation) -> bytes:
    event = json.loads(inv.objects[0].bytes())
    ad = ADS.get(event["ad"], {"campaign": "unknown", "cpc": 0.0, "cpm": 0.0})
    price = ad["cpc"] if event["type"] == "click" else ad["cpm"] / 1000
    event.update(campaign=ad["campaign"], price=price)
    ziptrail.send_object("enriched", inv.objects[0].key, json.dumps(event))
    return b""


def aggregate(inv: ziptrail.Invocation) -> bytes:
    stats: dict[str, dict] = {}
    for obj in inv.objects:
        e = json.loads(obj.bytes())
        s = stats.setdefault(e["campaign"], {"impressions": 0, "clicks": 0, "spend": 0.0})
        s["clicks" if e["type"] == "click" else "impressions"] += 1
        s["spend"] += e["price"]
    for s in stats.values():
        s["ctr"] = round(s["clicks"] / s["impressions"], 4) if s["impressions"] else 0.0
        s["spend"] = round(s["spend"], 4)
    ziptrail.send_object("output", "window", json.dumps({"events": len(inv.objects), "campaigns": stats}, sort_keys=True))
    return b""


ROLES = {"ingest": ingest, "enrich": enrich, "aggregate": aggregate}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ROLES:
        sys.exit(f"usage: adevents.py {'|'.join(ROLES)}")
    ziptrail.serve(ROLES[sys.argv[1]])
