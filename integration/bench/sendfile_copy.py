"""What sending a Fetch answer's records costs the sender: a copy (`writev`) or `sendfile`.

    .venv/bin/python integration/bench/sendfile_copy.py [--body-kib 256 64 16]
        [--mb 300] [--file-mb 320] [--rounds 3] [--out FILE.jsonl]

A Fetch answer is a run of record batches, each a rewritten 16-byte head (its base
offset and leader epoch) and the rest of the batch as stored. The agent writes the heads
and views of the bodies in one `writev` (the kernel copies the bodies into the socket);
a broker with its objects in files could write each head and then `os.sendfile` the body
from the file, as Kafka's zero-copy Fetch does, at the price of two system calls a batch.

This sends `--mb` MB over a loopback TCP connection (TCP_NODELAY, as the agent's) to a
reader in another process, in answers of 1 MiB of batches of `--body-kib`, both ways, in
turns (`--rounds` pairs per body size), and prints the sending process's user and system
CPU seconds per GB. The bodies come from a file of `--file-mb` MB mapped and populated
(`MADV_POPULATE_READ`), as the local store hands large ranges out, read from its start
to its end, so that most bytes sent are not in the CPU's caches, as in a catch-up read.
The reader's CPU is its own and is not counted. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import datetime
import json
import mmap
import multiprocessing
import os
import resource
import socket
import statistics
import tempfile
import time
from pathlib import Path

HEAD = 16
ANSWER = 1 << 20
MADV_POPULATE_READ = 22  # <linux/mman.h>


def _read_all(port: int) -> None:
    conn = socket.create_connection(("127.0.0.1", port))
    buffer = bytearray(1 << 20)
    while conn.recv_into(buffer):
        pass


def _answers(file_size: int, body: int, total: int) -> list[list[int]]:
    """The file offsets of each answer's bodies, walking the file from its start."""
    per_answer = max(1, ANSWER // (body + HEAD))
    answers, position, sent = [], 0, 0
    while sent < total:
        offsets = []
        for _ in range(per_answer):
            if position + body > file_size:
                position = 0
            offsets.append(position)
            position += body
            sent += HEAD + body
        answers.append(offsets)
    return answers


def _send_all(fd: int, parts: list[bytes | memoryview]) -> None:
    """A blocking writev of every part (a signal may cut one short)."""
    while parts:
        sent = os.writev(fd, parts)
        while parts and sent >= len(parts[0]):
            sent -= len(parts[0])
            parts = parts[1:]
        if sent:
            parts[0] = memoryview(parts[0])[sent:]


def one_run(mode: str, path: str, body: int, total: int) -> dict[str, float]:
    listener = socket.create_server(("127.0.0.1", 0))
    reader = multiprocessing.Process(target=_read_all, args=(listener.getsockname()[1],))
    reader.start()
    conn, _ = listener.accept()
    listener.close()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock = conn.fileno()
    file_fd = os.open(path, os.O_RDONLY)
    size = os.fstat(file_fd).st_size
    mapped = mmap.mmap(file_fd, size, prot=mmap.PROT_READ)
    mapped.madvise(MADV_POPULATE_READ)
    view = memoryview(mapped)
    answers = _answers(size, body, total)
    head = bytes(HEAD)
    before = resource.getrusage(resource.RUSAGE_SELF)
    began = time.perf_counter()
    for offsets in answers:
        if mode == "writev":
            _send_all(sock, [p for o in offsets for p in (head, view[o : o + body])])
        else:
            for offset in offsets:
                _send_all(sock, [head])
                done = 0
                while done < body:
                    done += os.sendfile(sock, file_fd, offset + done, body - done)
    conn.close()
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_SELF)
    reader.join()
    view.release()
    mapped.close()
    os.close(file_fd)
    gb = sum(len(o) for o in answers) * (HEAD + body) / 1e9
    return {
        "user_s_per_gb": round((after.ru_utime - before.ru_utime) / gb, 3),
        "system_s_per_gb": round((after.ru_stime - before.ru_stime) / gb, 3),
        "cpu_s_per_gb": round(
            (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) / gb, 3
        ),
        "mb_s": round(gb * 1000 / wall, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--body-kib", type=int, nargs="+", default=[256, 64, 16])
    parser.add_argument("--mb", type=int, default=300)
    parser.add_argument("--file-mb", type=int, default=320)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", help="append one JSON line per run to this file")
    args = parser.parse_args()
    folder = Path(__file__).resolve().parents[2]  # the disk the checkout is on
    with tempfile.NamedTemporaryFile(dir=folder, prefix=".sendfile-copy-") as f:
        for _ in range(args.file_mb):
            f.write(os.urandom(1 << 20))
        f.flush()
        os.fsync(f.fileno())
        results: dict[tuple[int, str], list[dict[str, float]]] = {}
        for body_kib in args.body_kib:
            for _ in range(args.rounds):
                for mode in ("writev", "sendfile"):
                    run = one_run(mode, f.name, body_kib * 1024, args.mb * 1_000_000)
                    results.setdefault((body_kib, mode), []).append(run)
                    line = {
                        "date": datetime.datetime.now().isoformat(timespec="seconds"),
                        "body_kib": body_kib,
                        "mode": mode,
                        **run,
                    }
                    print(json.dumps(line), flush=True)
                    if args.out:
                        with open(args.out, "a") as out:
                            out.write(json.dumps(line) + "\n")
    print("\n| body | way | sender CPU s/GB (runs) | median | of it system | MB/s median |")
    print("|---|---|---|---|---|---|")
    for (body_kib, mode), runs in results.items():
        cpu = [r["cpu_s_per_gb"] for r in runs]
        print(
            f"| {body_kib} KiB | {mode} | {', '.join(f'{c:.3f}' for c in cpu)} "
            f"| {statistics.median(cpu):.3f} "
            f"| {statistics.median(r['system_s_per_gb'] for r in runs):.3f} "
            f"| {statistics.median(r['mb_s'] for r in runs):.0f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
