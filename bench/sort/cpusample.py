"""Samples, every --interval seconds, the machine's CPU time (all cores,
/proc/stat) and the CPU time of a process tree (a pid and all its
descendants: bench/sort's local cluster, its pods, Redis, MinIO, Ray), one
JSON line per sample. bench/sort's report uses it to say how many cores a
sort actually got on a machine shared with other work.

    python3 cpusample.py PID [--interval 2] > samples.jsonl
"""

import argparse
import json
import os
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def machine():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return (sum(v[:8]) - idle) / TICK, idle / TICK


def tree_cpu(root, by_comm=None, also=None):
    """CPU seconds of root and its descendants; with by_comm (a dict),
    also added up by command name (the pods' python3, queue-proxy-zl,
    minio, redis-server, kube-apiserver, …)."""
    procs = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                s = f.read()
        except OSError:
            continue
        comm = s[s.index("(") + 1:s.rindex(")")]
        rest = s[s.rindex(")") + 2:].split()
        ppid = int(rest[1])
        # utime stime cutime cstime (reaped children count too)
        cpu = sum(int(x) for x in rest[11:15]) / TICK
        procs[int(p)] = (ppid, cpu, comm)
    kids = {}
    for pid, (ppid, _, _) in procs.items():
        kids.setdefault(ppid, []).append(pid)
    total, stack, seen = 0.0, [root], set()
    if also:
        # processes that left the tree (Ray's raylet and workers start in
        # sessions of their own): matched by their command line
        for pid in procs:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if also.encode() in f.read():
                        stack.append(pid)
            except OSError:
                pass
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        if pid in procs:
            total += procs[pid][1]
            if by_comm is not None:
                c = procs[pid][2]
                by_comm[c] = round(by_comm.get(c, 0.0) + procs[pid][1], 2)
        stack.extend(kids.get(pid, []))
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pid", type=int)
    ap.add_argument("--interval", type=float, default=2)
    ap.add_argument("--by-comm", action="store_true", help="also the tree's CPU by command name")
    ap.add_argument("--also", help="also count processes (and their descendants) whose command line contains this")
    a = ap.parse_args()
    while os.path.exists(f"/proc/{a.pid}"):
        busy, idle = machine()
        by = {} if a.by_comm else None
        rec = {"t": time.time(), "machineBusy": busy, "machineIdle": idle, "tree": tree_cpu(a.pid, by, a.also),
               "load": open("/proc/loadavg").read().split()[:3]}
        if by is not None:
            rec["byComm"] = by
        print(json.dumps(rec), flush=True)
        time.sleep(a.interval)


if __name__ == "__main__":
    sys.exit(main())
