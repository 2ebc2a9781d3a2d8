"""Level-2 packing: how the metadata layer's planner groups partitions into level-2 jobs
under a soak-like produce, in seconds rather than a soak's 20 minutes.

    .venv/bin/python integration/bench/l2_packing.py --seconds 480

It runs the planner and commits of `metadata.compaction` (the code the agents run) on a
SQLite metadata file, against a simulated clock and no object store: every `--flush-ms`
an ingest file of `--file-bytes` holding `--partitions-per-file` partitions picked at
random (entries of 0.95-1.3 x their share, each batch's max timestamp up to `--jitter-ms`
before the flush, as a producer's batches wait); the first `--gap-ms` of every minute
without files (a soak's producer is a new JVM each minute). Compaction runs as an agent
with the defaults does: a pass every `--pass-ms`, one job at a time until none is left,
level 1 first (promotion and level-1 jobs after `--min-age-ms`), then level 2 with the
topic's span (`--span-ms`, 5% of a 5-minute retention); a job takes 0.3 s plus its bytes
at `--job-mb-s`, then commits.

What it does not model: retention (the front of the log), the object store, several
agents and failures. Every file is promoted as it is, but for `--small-share` of them,
which hold one entry too small for that and wait for a level-1 job (a soak's flushes:
6,884 promoted against 101 level-1 jobs). It foretold level 2's grouping: with a rule
that joined partitions whatever their wait it gave level-2 jobs of 64 MB in the median,
and one soak's catch-up of three met objects of 62.5 MB (50-52 in the other two).
Without small files it did not foretell level 1 (README.md, 60th pass); with them it
showed how level-1 entries were left behind, and that they no longer are (61st pass).
What it reports of the level-2 jobs after `--warmup-s`: their number and sizes (a
catch-up read of every partition reads each output whole with one GET,
`broker.readahead`: GETs per GB is the job count per GB), partitions per job, the spread
of their batches' timestamps, and, weighted by bytes, how long a byte waits in its
object for the object's newest byte to pass retention (what the store holds beyond rate
x retention because of level 2's grouping); what level 1 holds; and the level-1 entries
left behind at the end (older than a minute, with level-2 data after them in their
partition: no level-2 run can take them).
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import sys
import tempfile
import uuid
from dataclasses import dataclass
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kio.schema.errors import ErrorCode  # noqa: E402

from metadata import compaction, keys, log, topics  # noqa: E402
from metadata.compaction import L1Selection, Limits, Plan  # noqa: E402
from metadata.kv import ReadTransaction, Transaction  # noqa: E402
from metadata.lifecycle import get_objects  # noqa: E402
from metadata.sqlite_kv import SQLiteKV  # noqa: E402

SUB = keys.cluster_subspace("packing")
LEASE_MS = 30_000
DELETE_DELAY_MS = 15_000
PROMOTING_SELECTIONS = 8  # as broker.compaction's
SMALL_ENTRY = 50_000  # bytes: below Limits.promote_bytes


@dataclass(frozen=True, slots=True)
class Job:
    partitions: int
    bytes: int
    spread_s: float  # newest - oldest batch max timestamp
    wait_s: float  # bytes-weighted: newest timestamp - the byte's


class Simulation:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.kv = SQLiteKV(os.path.join(tempfile.mkdtemp(prefix="l2-packing-"), "m.db"))
        self.topic = self.kv.transact_sync(
            lambda tr: topics.create_topic(tr, SUB, "t", uuid.uuid4().bytes, args.partitions, {}, 0)
        )
        self.limits = Limits()
        self.files = 0
        self.outputs = 0
        self.after: tuple[bytes, int] | None = None

    def ingest(self, now: int) -> None:
        a, tid = self.args, self.topic.topic_id
        share = a.file_bytes / a.partitions_per_file
        batches, start = [], 0
        chosen = sorted(self.rng.sample(range(a.partitions), a.partitions_per_file))
        # A file with one entry too small to be promoted waits for a level-1 job.
        small = self.rng.choice(chosen) if self.rng.random() < a.small_share else None
        for p in chosen:
            length = int(share * self.rng.uniform(0.95, 1.3)) if p != small else SMALL_ENTRY
            ts = now - int(self.rng.uniform(0, a.jitter_ms))
            batches.append(log.PendingBatch(tid, p, start, length, 99, ts, -1, -1, -1))
            start += length
        self.files += 1
        key = f"file-{self.files}"
        results = self.kv.transact_sync(
            lambda tr: log.commit_ingest(tr, SUB, key, start, max(now, 1), batches)
        )
        assert all(r.error == ErrorCode.none for r in results)

    def plan(self, now: int) -> Plan | None:
        a, limits = self.args, self.limits
        for _ in range(PROMOTING_SELECTIONS):
            selection = self.kv.read_sync(
                lambda tr: compaction.select_l1(tr, SUB, now, a.min_age_ms, limits)
            )
            if not (selection.chosen or selection.dropped or selection.promoted):
                break

            promoted, plan = self.kv.transact_sync(partial(_claim, selection=selection, now=now))
            if plan is not None:
                return plan
            if not promoted:
                break
        spans = {self.topic.topic_id: a.span_ms}
        plan = self.kv.transact_sync(
            lambda tr: compaction.plan_l2(
                tr, SUB, 1, now, limits, LEASE_MS, spans, (), max_wait_ms=600_000, after=self.after
            )
        )
        if plan is not None and plan.level_one_rows:
            self.after = plan.level_one_rows[-1][:2]
        return plan

    def commit(self, plan: Plan, now: int) -> None:
        self.outputs += 1
        key = f"output-{self.outputs}"
        starts, position = [], 8
        for _t, _p, entries in plan.partitions():
            starts.append(position)
            position += sum(e.length for e in entries)
        outputs = compaction.output_entries(plan, key, starts, 256 * 1024)
        result = self.kv.transact_sync(
            lambda tr: compaction.commit_job(
                tr, SUB, plan, 1, key, position, outputs, now, DELETE_DELAY_MS
            )
        )
        assert result.committed, result

    def level_one_bytes(self) -> int:
        """The bytes of the level-1 objects still referenced (what level 1 holds in the
        store, its dead partitions' bytes included)."""

        def read(tr: ReadTransaction) -> int:
            total = 0
            for _key, value in tr.get_range(*SUB.range(keys.OBJECT)):
                size, _live, _created, dead_since, level = keys.unpack_value(value)[:5]
                if level == compaction.L1 and dead_since is None:
                    total += int(size)
            return total

        return self.kv.read_sync(read)

    def left_behind(self, now: int) -> int:
        """Level-1 entries older than a minute with level-2 entries after them in their
        partition: entries no level-2 run can take any more (they wait for retention,
        and keep their objects)."""
        sub, topic_id = SUB, self.topic.topic_id

        def read(tr: ReadTransaction) -> int:
            found = 0
            for partition in range(self.args.partitions):
                entries = list(log.iter_entries(tr, sub, topic_id, partition))
                records = get_objects(tr, sub, [e.object_key for e in entries])
                levels = [r.level if r is not None else None for r in records]
                for index, record in enumerate(records):
                    if (
                        record is not None
                        and record.level == compaction.L1
                        and now - record.created_ms > 60_000
                        and compaction.L2 in levels[index + 1 :]
                    ):
                        found += 1
            return found

        return self.kv.read_sync(read)

    def run(self) -> tuple[list[Job], list[int]]:
        """The level-2 jobs after the warm-up, and the level-1 bytes at each pass's start."""
        a = self.args
        jobs: list[Job] = []
        level_one: list[int] = []
        next_flush, next_pass = 0, a.pass_ms
        running: tuple[Plan, int] | None = None  # a job and when it ends
        while True:
            now = min(next_flush, running[1] if running else next_pass)
            if now >= a.seconds * 1000:
                return jobs, level_one
            if now == next_flush:
                if now % 60_000 >= a.gap_ms:
                    self.ingest(now)
                next_flush += a.flush_ms
                continue
            if running is not None:
                plan = running[0]
                self.commit(plan, now)
                if plan.level == compaction.L2 and now >= a.warmup_s * 1000:
                    jobs.append(_job(plan))
            plan = self.plan(now)
            if plan is None:
                running, next_pass = None, now + a.pass_ms
                if now >= a.warmup_s * 1000:
                    level_one.append(self.level_one_bytes())
            else:
                running = (plan, now + 300 + int(plan.input_bytes / (a.job_mb_s * 1000)))


def _claim(tr: Transaction, *, selection: L1Selection, now: int) -> tuple[int, Plan | None]:
    """Promote what the selection promotes and claim its level-1 job, as an agent does."""
    promoted = compaction.promote_l1(tr, SUB, selection, now)
    return promoted, compaction.claim_l1(tr, SUB, selection, 1, now, LEASE_MS)


def _job(plan: Plan) -> Job:
    times = [e.entry.max_timestamp for e in plan.entries]
    newest = max(times)
    waited = sum(e.entry.length * (newest - e.entry.max_timestamp) for e in plan.entries)
    return Job(
        len(plan.partitions()),
        plan.input_bytes,
        (newest - min(times)) / 1000,
        waited / plan.input_bytes / 1000,
    )


def _tenths(values: list[float]) -> str:
    values = sorted(values)
    return " / ".join(f"{values[len(values) * q // 10]:.3g}" for q in (1, 5, 9))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=480)
    parser.add_argument("--warmup-s", type=int, default=120)
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--flush-ms", type=int, default=143)
    parser.add_argument("--file-bytes", type=int, default=4_000_000)
    parser.add_argument("--partitions-per-file", type=int, default=20)
    parser.add_argument("--jitter-ms", type=int, default=1000)
    parser.add_argument("--gap-ms", type=int, default=2000)
    parser.add_argument("--min-age-ms", type=int, default=10_000)
    parser.add_argument("--pass-ms", type=int, default=5000)
    parser.add_argument("--span-ms", type=int, default=15_000)
    parser.add_argument("--job-mb-s", type=float, default=300)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--small-share",
        type=float,
        default=0.0,
        help="share of ingest files holding one entry too small to be promoted as it is",
    )
    args = parser.parse_args()
    simulation = Simulation(args)
    jobs, level_one = simulation.run()
    if not jobs:
        print("no level-2 job after the warm-up")
        return 1
    mb = sum(j.bytes for j in jobs) / 1e6
    wait = sum(j.wait_s * j.bytes for j in jobs) / sum(j.bytes for j in jobs)
    print(
        f"level-2 jobs {len(jobs)} for {mb:.0f} MB: {len(jobs) / (mb / 1000):.1f} per GB;"
        f" 10th / 50th / 90th percentiles: MB {_tenths([j.bytes / 1e6 for j in jobs])},"
        f" partitions {_tenths([j.partitions for j in jobs])}, timestamp spread s"
        f" {_tenths([j.spread_s for j in jobs])}; a byte waits {wait:.1f} s for its object's"
        " newest (weighted by bytes); level 1 holds (10th / 50th / 90th percentiles) MB"
        f" {_tenths([b / 1e6 for b in level_one])}"
    )
    print(
        "level-1 entries left behind at the end (older than a minute, level-2 data after"
        f" them): {simulation.left_behind(args.seconds * 1000)}"
    )
    counts = collections.Counter(j.partitions for j in jobs)
    print("jobs by partitions: " + ", ".join(f"{p}: {n}" for p, n in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
