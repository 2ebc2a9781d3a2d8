"""Where a produce's time goes inside the agent at 1,000 records/s end to end.

    .venv/bin/python integration/bench/results/2026-12-04-e2e-agent-latency.py

One agent of this checkout (compaction off) with its metrics port; run.py's end_to_end
for 3 s to warm up, then for 10 s; the agent's own histograms (broker/metrics.py) over
those 10 s, from /metrics before and after: the Produce and Fetch requests (arrival to
answer), and each flush's upload, commit and whole (start to answers). Bucket bounds, so
p50 and p99 are upper bounds; means are exact.

2026-12-04, on 41d41e4:

    end to end: produce acks p50 5.85 ms, p99 9.02 (linger 5 ms; records every 1 ms)
    Produce request   n=1719  mean 1.76 ms  p50 <= 2.5  p99 <= 5
    Fetch request     n=1723  mean 6.50 ms  (the long poll's wait included)
    flush, whole      n=1719  mean 1.38 ms  p50 <= 2.5  p99 <= 2.5
    flush upload      n=1719  mean 0.57 ms  p50 <= 1    p99 <= 2.5
    flush commit      n=1719  mean 0.72 ms  p50 <= 1    p99 <= 2.5

and once again at 22:50 on d54bb84 (one run of each tree: not a comparison):

    end to end: produce acks p50 5.39 ms, p99 8.03
    Produce request   n=1689  mean 1.44 ms  p50 <= 2.5  p99 <= 2.5
    flush, whole      n=1689  mean 1.17 ms;  upload 0.47 ms;  commit 0.62 ms
"""

import json
import re
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # integration/bench
import run as B  # noqa: E402

HISTOGRAMS = (
    "request_seconds",
    "flush_upload_seconds",
    "metadata_commit_seconds",
    "flush_end_to_end_seconds",
)
LINE = re.compile(
    r"(bucketlog_(?:" + "|".join(HISTOGRAMS) + r")_(?:bucket|sum|count))\{?(.*?)\}? (\S+)$"
)


def scrape(port: int) -> dict[tuple[str, str], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    return {(m[1], m[2]): float(m[3]) for m in map(LINE.match, text.splitlines()) if m}


def without_le(labels: str) -> str:
    return re.sub(r',?le="[^"]*"', "", labels)


port = B.free_port()
system = B.Bucketlog(1, extra_args=["--compaction=false", f"--metrics-port={port}"])
system.start()
try:
    B.create_topic(system.bootstrap, "warm", 1)
    B.create_topic(system.bootstrap, "measured", 1)
    time.sleep(1)
    B.end_to_end(system.bootstrap, "warm", 1000, 3)
    before = scrape(port)
    result = B.end_to_end(system.bootstrap, "measured", 1000, 10)
    after = scrape(port)
    print(json.dumps({k: round(v, 2) for k, v in result.items()}))
    moved = {k: v - before.get(k, 0) for k, v in after.items()}
    for base, labels in sorted({(k[0].rsplit("_", 1)[0], without_le(k[1])) for k in moved}):
        if "api=" in labels and not ('"Produce"' in labels or '"Fetch"' in labels):
            continue
        count = moved.get((base + "_count", labels), 0)
        if not count:
            continue
        total = moved.get((base + "_sum", labels), 0)
        buckets = sorted(
            (float(re.search(r'le="([^"]*)"', k[1])[1].replace("+Inf", "inf")), v)
            for k, v in moved.items()
            if k[0] == base + "_bucket" and without_le(k[1]) == labels
        )
        p50 = next(b for b, v in buckets if v >= count * 0.5)
        p99 = next(b for b, v in buckets if v >= count * 0.99)
        print(
            f"{base} {labels} n={count:.0f} mean={total / count * 1000:.2f} ms "
            f"p50<={p50 * 1000:g} ms p99<={p99 * 1000:g} ms"
        )
finally:
    system.stop()
