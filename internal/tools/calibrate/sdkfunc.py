"""The functions of calibrate's control-path sessions (control.go).

Served with the Python SDK's function server behind a real queue-proxy-zl
(``PORT``, ``ZIPTRAIL_SOCKET``, ``ZIPTRAIL_SHM_DIR`` from the
environment), like a shuffle's functions:

- ``split`` sends one task object per map to ``tasks`` (the session's
  input says how many maps, objects per map and groups);
- ``map`` sends its objects to ``shuffle`` through the sidecar
  (``send_object``, tagged with the invocation) as ``shuffle.Writer``
  sends its pointers: 256 bytes each, with its metadata (the group, the
  mapper, the job's description);
- ``reduce`` (one per group, a DynamicGroup firing) sends one object to
  ``parts``;
- ``collect`` (once every reducer finished) sends the result, after
  ``hold`` seconds (the session's input): the session stays open with
  every object the engine keeps of it (its checkpoints grow with them),
  and busy: a tick object to ``ticks`` every 0.1 s, as a running shuffle
  keeps changing its session (an unchanged one is not saved again).
"""

import json
import time

import ziptrail
from ziptrail import server

POINTER = b"p" * 256
#: a held session's tick period (control.go's holdTick)
TICK = 0.1
#: a shuffle job's description, carried on every object it sends (zt-job,
#: as shuffle.Writer does): the engine keeps it with every object
JOB = json.dumps({"name": "calibrate-control", "method": "s3", "partitions": 64, "rounds": 1,
                  "params": {"bytes": 1 << 30, "seed": 17, "taskRecords": 671088, "fastCapacity": 0},
                  "tasks_bucket": "tasks", "final_bucket": "final", "output_bucket": "parts",
                  "shuffle_prefix": "shuffle-r", "runs_prefix": "runs-r", "ledger_bucket": "ledger"}, separators=(",", ":"))
client = ziptrail.Client()


def handler(inv):
    fn = inv.function.rsplit("-", 1)[-1]  # the Service is <workflow>-<function>
    if fn == "split":
        p = json.loads(bytes(inv.objects[0].data))
        for i in range(p["maps"]):
            server.send_object("tasks", f"t{i}", json.dumps({**p, "map": i}))
    elif fn == "map":
        p = json.loads(bytes(inv.objects[0].data))
        n, g, m = p["objects"], p["groups"], p["map"]
        for j in range(n):
            client.send_object("shuffle", f"m{m}.{j}", POINTER, session=inv.session,
                               metadata={"group": f"p{(m * n + j) % g}", "zt-mapper": str(m), "zt-partition": str((m * n + j) % g),
                                         "zt-round": "0", "zt-shuffle": "pointer", "zt-job": JOB, "zt-hold": str(p.get("hold", 0))},
                               invocation_id=inv.id)
    elif fn == "reduce":
        server.send_object("parts", inv.group or "p", inv.objects[0].metadata.get("zt-hold", "0"), {"group": "all"})
    elif fn == "collect":
        # hold the session (and every object the engine keeps of it) open,
        # busy as a running shuffle is: a tick object every TICK seconds
        # changes the session, so that the engine saves it at every
        # checkpoint (control.go's holdTicks counts them)
        hold = float(bytes(inv.objects[0].data) or b"0")
        for i in range(int(round(hold / TICK))):
            client.send_object("ticks", f"t{i}", b"t", session=inv.session, invocation_id=inv.id)
            time.sleep(TICK)
        server.send_object("output", "result", str(len(inv.objects)))
    else:
        raise ValueError(f"no function {inv.function}")
    return None


if __name__ == "__main__":
    server.serve(handler)
