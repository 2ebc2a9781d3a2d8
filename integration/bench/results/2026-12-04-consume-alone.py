"""consume-1p's read alone on a fresh broker of each system: its MB/s and the client's CPU.

    .venv/bin/python integration/bench/results/2026-12-04-consume-alone.py bucketlog kafka

For each system named, one broker (bucketlog: one agent with compaction off, so that
nothing runs beside the read): three one-partition topics written with 300,000 1 KiB
records each by ProducerPerformance, 10 s to settle, then ConsumerPerformance reading
each, measured as run.py does. One line a read: its MB/s, the client's CPU seconds
(run.py's client_cpu_seconds), the broker's user and system CPU seconds.

2026-12-04, 21:47-21:51, on 41d41e4:

    bucketlog  314.0, 302.7, 329.5 MB/s   client CPU 3.04, 3.22, 3.11 s   broker 0.52, 0.40, 0.36 s
    kafka      250.6, 333.7, 256.1 MB/s   client CPU 3.16, 3.14, 3.20 s   broker 1.50, 0.47, 0.60 s

Alone, the same reads cost the client the same CPU on both brokers. In the main tables'
consume-1p rows of the same day (pass38 to pass41-second, bucketlog's rows run after
Kafka's whole table) the client used 3.29-4.58 s a read against bucketlog and 2.81-4.35
against Kafka; in the pass41 table 4.45, 4.58 and 3.36 against 3.11, 2.81 and 3.05.
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # integration/bench
import run as B  # noqa: E402

RECORDS = 300_000
for name in sys.argv[1:]:
    system = B.Kafka() if name == "kafka" else B.Bucketlog(1, extra_args=["--compaction=false"])
    system.start()
    try:
        topics = []
        for k in range(3):
            topic = f"c{k}"
            B.create_topic(system.bootstrap, topic, 1)
            B.producers_perf(system.bootstrap, topic, 1, RECORDS, "none")
            topics.append(topic)
        time.sleep(10)
        for topic in topics:
            client0 = B.client_cpu_seconds()
            broker0 = B.tree_cpu_user_system(system.root_pid)
            read = B.consumer_perf(system.bootstrap, topic, RECORDS)
            client1 = B.client_cpu_seconds()
            broker1 = B.tree_cpu_user_system(system.root_pid)
            line = {
                "system": name,
                "mb_s": read["mb_s"],
                "client_cpu_s": round(client1 - client0, 2),
                "broker_user_s": round(broker1[0] - broker0[0], 2),
                "broker_system_s": round(broker1[1] - broker0[1], 2),
            }
            print(json.dumps(line), flush=True)
    finally:
        system.stop()
