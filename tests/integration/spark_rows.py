"""Spark's Kafka rows as `Rec` values, to compare with what was produced."""

from __future__ import annotations

from typing import Any

from tests.integration.support import Rec

# The Kafka source's columns, with the timestamp in epoch milliseconds (Spark's own
# column is a TimestampType; unix_millis keeps it exact).
COLUMNS = ["topic", "partition", "offset", "unix_millis(timestamp) AS ts", "key", "value"]


def _bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def to_recs(df: Any, *, headers: bool = False) -> list[Rec]:
    """Collect a Kafka source DataFrame (batch) into sorted `Rec`s."""
    rows = df.selectExpr(*COLUMNS, *(["headers"] if headers else [])).collect()
    out = []
    for row in rows:
        hdrs: tuple[tuple[str, bytes | None], ...] = ()
        if headers and row["headers"] is not None:
            hdrs = tuple((h["key"], _bytes(h["value"])) for h in row["headers"])
        out.append(
            Rec(
                row["topic"],
                row["partition"],
                row["offset"],
                row["ts"],
                _bytes(row["key"]),
                _bytes(row["value"]),
                hdrs,
            )
        )
    return sorted(out)


def without_headers(recs: list[Rec]) -> list[Rec]:
    return sorted(Rec(r.topic, r.partition, r.offset, r.timestamp, r.key, r.value) for r in recs)
