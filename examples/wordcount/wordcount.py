"""MapReduce word count on ziptrail (Pheromone-MR style, Appendix A.3).

One program, four functions, chosen by the first argument:

  split    the session input -> MAPPERS chunks in bucket "chunks"
           (an Immediate trigger invokes map once per chunk)
  map      one chunk -> REDUCERS partial counts in bucket "shuffle", each
           tagged with metadata group=p<r> (a DynamicGroup trigger invokes
           reduce once per group when every mapper has finished)
  reduce   one group's partial counts -> merged counts in bucket "counts",
           declaring that REDUCERS such objects are expected (a DynamicJoin
           trigger invokes collect when all have arrived)
  collect  every partition -> the result in bucket "output" (completes the
           session): total words, distinct words and the top 20
"""

import json
import os
import re
import sys
import zlib
from collections import Counter

import ziptrail

MAPPERS = int(os.environ.get("MAPPERS", "4"))
REDUCERS = int(os.environ.get("REDUCERS", "3"))
WORD = re.compile(r"[a-z]+")


def words(text: str) -> list[str]:
    """The tokenization the demo's check uses too: lowercase ASCII letters."""
    return WORD.findall(text.lower())


def split(inv: ziptrail.Invocation) -> bytes:
    lines = inv.objects[0].bytes().decode().splitlines(keepends=True)
    per = max(1, -(-len(lines) // MAPPERS))
    for i in range(MAPPERS):
        ziptrail.send_object("chunks", f"chunk-{i}", "".join(lines[i * per:(i + 1) * per]))
    return b""


def map_(inv: ziptrail.Invocation) -> bytes:
    chunk = inv.objects[0]
    parts = [Counter() for _ in range(REDUCERS)]
    for w in words(chunk.bytes().decode()):
        parts[zlib.crc32(w.encode()) % REDUCERS][w] += 1
    # Every partition is sent, empty or not, so every group exists.
    for r, counts in enumerate(parts):
        ziptrail.send_object("shuffle", f"{chunk.key}-p{r}", json.dumps(counts), metadata={"group": f"p{r}"})
    return b""


def reduce_(inv: ziptrail.Invocation) -> bytes:
    total = Counter()
    for obj in inv.objects:
        total.update(json.loads(obj.bytes()))
    ziptrail.send_object("counts", inv.group, json.dumps(total),
                         metadata={"ziptrail.expected-count": str(REDUCERS)})
    return b""


def collect(inv: ziptrail.Invocation) -> bytes:
    total = Counter()
    for obj in inv.objects:
        total.update(json.loads(obj.bytes()))
    result = {"total": sum(total.values()), "distinct": len(total),
              "top": sorted(total.items(), key=lambda kv: (-kv[1], kv[0]))[:20]}
    ziptrail.send_object("output", "result", json.dumps(result))
    return b""


ROLES = {"split": split, "map": map_, "reduce": reduce_, "collect": collect}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ROLES:
        sys.exit(f"usage: wordcount.py {'|'.join(ROLES)}")
    ziptrail.serve(ROLES[sys.argv[1]])
