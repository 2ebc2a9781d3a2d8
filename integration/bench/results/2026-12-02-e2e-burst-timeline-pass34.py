"""What the agent and compaction's processes do, every 2 s, while records are produced
end to end at 1,000 a second for 50 s right after 600,000 records of 1 KiB into one
partition (one ProducerPerformance). Per row as in 2026-12-02-e2e-timeline-pass32.py,
with the ingest files promoted to level 1 without a copy (`pr`). Arguments:
comma-separated `bucketlog serve` arguments ('' for the defaults), then NAME=VALUE
environment variables for the agent. Thirty-fourth pass of integration/bench/README.md."""

import os
import re
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import run as bench  # noqa: E402

args = [a for a in sys.argv[1].split(",") if a] + ["--metrics-port=9513"]
HZ = os.sysconf("SC_CLK_TCK")


def tree(pid):
    out = subprocess.run(
        ["ps", "-e", "-o", "pid=,ppid=,comm="], capture_output=True, text=True
    ).stdout
    kids = {}
    for line in out.splitlines():
        p, pp, _comm = line.split(None, 2)
        kids.setdefault(int(pp), []).append(int(p))
    res, todo = [], [pid]
    while todo:
        p = todo.pop()
        res.append(p)
        todo += kids.get(p, [])
    return res


def stat(pid):
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        io = dict(line.split(": ") for line in open(f"/proc/{pid}/io").read().splitlines())
        return (int(f[11]) + int(f[12])) / HZ, int(io["read_bytes"]), int(io["write_bytes"])
    except OSError:
        return (0.0, 0, 0)


def scrape():
    text = urllib.request.urlopen("http://127.0.0.1:9513/metrics").read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(
            r'bucketlog_(flush_upload|metadata_commit|flush_end_to_end)_seconds_(bucket|count)(\{le="([^"]+)"\})? ([0-9.e+]+)',
            line,
        )
        if m:
            name, kind, _, le, v = m.groups()
            out[(name, le if kind == "bucket" else "count")] = float(v)
        m = re.match(
            r"bucketlog_compaction_(bytes_written|l1_jobs|l2_jobs|l1_promoted)_total ([0-9.e+]+)",
            line,
        )
        if m:
            out[m.group(1)] = float(m.group(2))
        m = re.match(r"bucketlog_lifecycle_objects_deleted_total ([0-9.e+]+)", line)
        if m:
            out["del"] = float(m.group(1))
    return out


system = bench.Bucketlog(1, args, env=dict(a.split("=", 1) for a in sys.argv[2:]))
system.start()
res = {}
names = {}
try:
    bench.create_topic(system.bootstrap, "w", 1)
    bench.producer_perf(system.bootstrap, "w", 600_000, "none")
    bench.create_topic(system.bootstrap, "e", 1)
    t = threading.Thread(
        target=lambda: res.update(bench.end_to_end(system.bootstrap, "e", 1000, 50))
    )
    t0 = time.time()
    t.start()
    prev = scrape()
    pc = {p: stat(p) for p in tree(system.root_pid)}
    while t.is_alive():
        time.sleep(2)
        cur = scrape()
        cc = {p: stat(p) for p in tree(system.root_pid)}

        def d(k, cur=cur, prev=prev):
            return cur.get(k, 0) - prev.get(k, 0)

        row = [
            f"{time.time() - t0:5.1f}",
            f"cw {d('bytes_written') / 1e6:4.0f}MB j{d('l1_jobs'):.0f}/{d('l2_jobs'):.0f} pr{d('l1_promoted'):.0f} del{d('del'):.0f}",
        ]
        for name in ("metadata_commit", "flush_upload", "flush_end_to_end"):
            n = d((name, "count"))
            row.append(
                f"{name[:5]} {n:4.0f} >10:{n - d((name, '0.01')):3.0f} >25:{n - d((name, '0.025')):3.0f}"
            )
        parts = []
        for p in sorted(cc):
            a, b = cc[p], pc.get(p, (0, 0, 0))
            c = a[0] - b[0]
            if c > 0.02:
                parts.append(
                    f"{p % 1000}:{c / 2:.2f}c r{(a[1] - b[1]) / 2e6:.0f} w{(a[2] - b[2]) / 2e6:.0f}"
                )
        row.append(" ".join(parts))
        print(" | ".join(row), flush=True)
        prev, pc = cur, cc
    t.join()
    print({k: round(v, 1) for k, v in res.items() if "p99" in k or "p50" in k})
finally:
    system.stop()
