"""How many cores each sort of a bench/sort run got: joins the run's log
(its "[i/n] … started" and "… done" lines, UTC) with cpusample.py's samples
(the machine's CPU time and the CPU time of bench/sort's process tree: the
local cluster, its pods, Redis, MinIO and the Ray peer).

    python3 cpushare.py RUN.log SAMPLES.jsonl [--date 2026-11-24] [--json OUT]

Per run: wall time, CPU seconds the tree used, the cores it got on average
(tree CPU / wall) and the cores everything else on the machine used
(machine busy − tree, over wall).
"""

import argparse
import bisect
import datetime as dt
import json
import re


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("samples")
    ap.add_argument("--date", default=None, help="the run's UTC date (default: the first sample's)")
    ap.add_argument("--json")
    a = ap.parse_args()
    samples = [json.loads(l) for l in open(a.samples) if l.strip()]
    ts = [s["t"] for s in samples]
    day = a.date or dt.datetime.fromtimestamp(ts[0], dt.timezone.utc).strftime("%Y-%m-%d")

    def at(hms: str) -> float:
        return dt.datetime.strptime(f"{day} {hms}", "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.timezone.utc).timestamp()

    def sample(t: float) -> dict:
        i = min(max(bisect.bisect_left(ts, t), 0), len(ts) - 1)
        return samples[i]

    runs, order = {}, []
    pat = re.compile(r"^(\d\d:\d\d:\d\d) \[(\d+)/\d+\] (.+?) via (\S+)(?: \([^)]*\))?: (started|done|FAILED)")
    for line in open(a.log):
        m = pat.match(line)
        if not m:
            continue
        hms, i, size, method, what = m.groups()
        r = runs.setdefault(i, {"step": int(i), "size": size, "method": method})
        if i not in order:
            order.append(i)
        if what == "started":
            r["start"] = at(hms)
        else:
            r["end"], r["outcome"] = at(hms), what
    out = []
    by_comm = any("byComm" in x for x in samples)
    print("| size | method | wall | cluster CPU | cores the sort got | cores the rest of the machine used | load (1 min) at start |"
          + (" CPU seconds by command |" if by_comm else ""))
    print("|---|---|---|---|---|---|---|" + ("---|" if by_comm else ""))
    for i in order:
        r = runs[i]
        if "start" not in r or "end" not in r:
            continue
        s0, s1 = sample(r["start"]), sample(r["end"])
        if r["method"].lower() == "ray":
            # Ray's processes exit at ray.shutdown, just before the run's
            # "done" line, and take their CPU time with them: end at the
            # last sample before that
            j = max(0, bisect.bisect_left(ts, r["end"]) - 2)
            s1 = samples[j]
        wall = s1["t"] - s0["t"]
        if wall <= 0:
            continue
        tree = s1["tree"] - s0["tree"]
        busy = s1["machineBusy"] - s0["machineBusy"]
        row = {**{k: r[k] for k in ("step", "size", "method", "outcome")}, "wall": round(wall, 1),
               "treeCpuSeconds": round(tree, 1), "coresGot": round(tree / wall, 2),
               "coresOthers": round(max(0.0, busy - tree) / wall, 2), "load": s0["load"][0]}
        if "byComm" in s0 and "byComm" in s1:
            d = {c: s1["byComm"].get(c, 0) - s0["byComm"].get(c, 0) for c in s1["byComm"]}
            row["cpuByCommand"] = {c: round(v, 1) for c, v in sorted(d.items(), key=lambda x: -x[1]) if v >= 0.5}
        out.append(row)
        by = ""
        if "cpuByCommand" in row:
            by = " | " + ", ".join(f"{c} {v:.0f}" for c, v in list(row["cpuByCommand"].items())[:7])
        print(f"| {r['size']} | {r['method']} | {wall:.0f}s | {tree:.0f} s | {row['coresGot']:.2f} | {row['coresOthers']:.2f} | {s0['load'][0]}{by} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
