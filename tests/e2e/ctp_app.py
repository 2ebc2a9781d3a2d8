"""A consume-transform-produce application, run as its own process by the tests.

Reads `input` in group `ctp`, writes each value upper-cased to `output`, and commits the
consumed offsets inside the same transaction. Exits once it has processed records and then
seen none for five seconds (or after `deadline` seconds).
"""

from __future__ import annotations

import sys
import time

from confluent_kafka import Consumer, KafkaException, Producer


def main(bootstrap: str, deadline_seconds: float) -> int:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "ctp",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "session.timeout.ms": 6000,
        }
    )
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "ctp-app"})
    producer.init_transactions(30)
    consumer.subscribe(["input"])
    done = 0
    idle = 0
    deadline = time.monotonic() + deadline_seconds
    while idle < 20 and time.monotonic() < deadline:
        messages = consumer.consume(50, 0.25)
        messages = [m for m in messages if m.error() is None]
        if not messages:
            idle += 1 if done else 0
            continue
        idle = 0
        producer.begin_transaction()
        for m in messages:
            producer.produce(
                "output", key=m.key(), value=m.value().upper(), partition=m.partition()
            )
        try:
            producer.send_offsets_to_transaction(
                consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 30
            )
            producer.commit_transaction(30)
        except KafkaException as exc:
            print("transaction failed:", exc, file=sys.stderr, flush=True)
            return 2
        done += len(messages)
        print("committed", done, flush=True)
    consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], float(sys.argv[2])))
