"""A local folder's flushes packed into segment files (storage.segments)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import anyio
import pytest

from storage import segments
from storage.local import LocalObjectStore
from storage.objectstore import ObjectExistsError, ObjectInfo, ObjectNotFoundError, ObjectStoreError
from storage.segments import PAGE, SEGMENT_FOLDER, is_packed_key


def listed(store: LocalObjectStore, prefix: str = "", **kwargs: str) -> list[ObjectInfo]:
    return anyio.run(partial(store.list, prefix, **kwargs))


def delete(store: LocalObjectStore, key: str) -> None:
    anyio.run(store.delete, key)


def segment_files(root: Path) -> list[Path]:
    folder = root / SEGMENT_FOLDER
    return (
        sorted(p for p in folder.iterdir() if not p.name.startswith(".tmp."))
        if folder.exists()
        else []
    )


def put_packed(store: LocalObjectStore, data: bytes, prefix: str = "ingest/") -> str:
    key = store.new_key(prefix, len(data))
    assert is_packed_key(key), key
    store.put_sync(key, data, if_absent=True)
    return key


def test_a_packed_object_reads_back_every_way(tmp_path: Path) -> None:
    store = LocalObjectStore(str(tmp_path), segments=True)
    data = os.urandom(3 * PAGE + 123)
    key = put_packed(store, data)
    other = put_packed(store, b"second")
    assert key.startswith("ingest/") and key != other
    assert [p.name for p in tmp_path.iterdir()] == [SEGMENT_FOLDER], "no file per object"
    assert store.get_sync(key) == data
    assert store.get_sync(key, 10, 20) == data[10:20]
    assert store.get_sync(key, -5) == data[-5:]
    assert bytes(store.get_view_sync(key, 1, None)) == data[1:]
    assert bytes(store.get_view_sync(key, 0, 10**9)) == data
    stream = store.open_range_stream(key, PAGE - 1, 2 * PAGE)
    try:
        assert stream.read(2) + stream.read(10**6) == data[PAGE - 1 : 2 * PAGE]
        assert stream.read(10) == b""
    finally:
        stream.close()
    assert store.get_sync(other) == b"second"
    # Another store on the same root, segments off (as compaction's worker process opens
    # it), reads, lists and deletes the same keys.
    reader = LocalObjectStore(str(tmp_path))
    assert reader.get_sync(key) == data
    infos = listed(reader, "ingest/")
    assert [(i.key, i.size) for i in infos] == sorted([(key, len(data)), (other, 6)])
    assert all(abs(i.last_modified - time.time()) < 60 for i in infos)
    delete(reader, key)
    with pytest.raises(ObjectNotFoundError):
        store.get_sync(key)
    with pytest.raises(ObjectNotFoundError):
        store.open_range_stream(key, 0)
    delete(reader, key)  # deleting again: no error
    assert [i.key for i in listed(store)] == [other]


def test_files_and_packed_objects_list_together_in_key_order(tmp_path: Path) -> None:
    store = LocalObjectStore(str(tmp_path), segments=True)
    first = put_packed(store, b"a")
    store.put_sync("ingest/~file", b"b", if_absent=True)  # "~" sorts after the ULIDs
    store.put_sync("l1/output", b"c", if_absent=True)
    last = put_packed(store, b"d")
    assert [i.key for i in listed(store)] == [first, last, "ingest/~file", "l1/output"]
    assert [i.key for i in listed(store, "ingest/", start_after=first)] == [
        last,
        "ingest/~file",
    ]
    assert [i.key for i in listed(store, "l1/")] == ["l1/output"]
    assert anyio.run(store.list_folders, "") == ["ingest", "l1"], (
        "the segments' folder is no folder"
    )
    with pytest.raises(ValueError):
        store.put_sync(f"{SEGMENT_FOLDER}/x", b"x")


def test_a_list_passes_by_the_closed_segments_holding_none_of_its_prefix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scans: list[int] = []
    records = segments._records

    def counted(fd: int, nonce: bytes) -> Iterator[tuple[str, int, int]]:
        scans.append(fd)
        return records(fd, nonce)

    monkeypatch.setattr(segments, "_records", counted)
    store = LocalObjectStore(str(tmp_path), segments=True)
    ingest = put_packed(store, b"a")
    other = put_packed(store, b"b", prefix="j/0/")
    assert listed(store, "ready/") == [] and len(scans) == 1
    assert listed(store, "ready/") == [] and len(scans) == 2, "held by its writer: read"
    anyio.run(store.aclose)
    scans.clear()
    reader = LocalObjectStore(str(tmp_path))
    assert listed(reader, "ready/") == [] and len(scans) == 1, "read once more"
    assert listed(reader, "ready/") == [] and len(scans) == 1, "then passed by"
    assert listed(reader, "j/1") == [] and len(scans) == 1
    assert [i.key for i in listed(reader, "in")] == [ingest] and len(scans) == 2
    assert [i.key for i in listed(reader, "j/0/")] == [other] and len(scans) == 3
    assert [i.key for i in listed(reader, "j/0/" + other[4:8])] == [other]
    delete(reader, other)
    assert listed(reader, "j/") == [], "a deleted record: not listed"
    assert [i.key for i in listed(reader)] == [ingest]


def test_a_put_only_writes_a_place_reserved_here(tmp_path: Path) -> None:
    store = LocalObjectStore(str(tmp_path), segments=True)
    key = store.new_key("ingest/", 5)
    with pytest.raises(ObjectStoreError, match="reserved for 5"):
        store.put_sync(key, b"too long", if_absent=True)
    key = put_packed(store, b"12345")
    with pytest.raises(ObjectExistsError):
        store.put_sync(key, b"54321", if_absent=True)
    assert store.get_sync(key) == b"12345"
    with pytest.raises(ObjectStoreError, match="not reserved"):
        LocalObjectStore(str(tmp_path)).put_sync(key, b"12345", if_absent=True)
    unpacked = LocalObjectStore(str(tmp_path / "plain"))
    assert not is_packed_key(unpacked.new_key("ingest/", 5)), "segments off: a file"
    assert not is_packed_key(store.new_key("ingest/", segments.PACK_MAX + 1)), "too large"


def test_deletes_free_the_blocks_and_the_last_one_the_segment(tmp_path: Path) -> None:
    store = LocalObjectStore(str(tmp_path), segments=True)
    keys = [put_packed(store, os.urandom(64 * PAGE)) for _ in range(4)]
    (segment,) = segment_files(tmp_path)
    full = segment.stat().st_blocks
    delete(store, keys[0])
    assert segment.stat().st_blocks <= full - 64 * PAGE // 512, "its pages punched out"
    for key in keys[1:]:
        delete(store, key)
    assert segment_files(tmp_path) == [segment], "its writer may still add to it"
    key = put_packed(store, b"after")
    anyio.run(store.aclose)  # the writer lets go of its segment
    assert segment_files(tmp_path) == [segment]
    delete(store, key)
    assert segment_files(tmp_path) == [], "no record left, nobody holding it"


def test_delete_many_punches_each_run_of_adjacent_records_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalObjectStore(str(tmp_path), segments=True)
    data = [os.urandom(8 * PAGE) for _ in range(6)]
    keys = [put_packed(store, d) for d in data]
    (segment,) = segment_files(tmp_path)
    full = segment.stat().st_blocks
    punched: list[tuple[int, int]] = []
    punch = segments._punch

    def counted(fd: int, start: int, length: int) -> bool:
        punched.append((start, length))
        return punch(fd, start, length)

    monkeypatch.setattr(segments, "_punch", counted)
    stream = store.open_range_stream(keys[3], 0)  # held: not deleted, splits the runs
    try:
        failed = store.segments.delete_many([keys[4], keys[0], keys[1], keys[3], keys[2]])
        assert failed == {}
        assert len(punched) == 2, "records 0-2 in one punch, 4 in another, 3 held"
        assert punched[0][1] == 3 * punched[1][1]
        assert segment.stat().st_blocks <= full - 4 * 8 * PAGE // 512
        assert stream.read(10**6) == data[3]
    finally:
        stream.close()
    for key in (*keys[:3], keys[4]):
        with pytest.raises(ObjectNotFoundError):
            store.get_sync(key)
    for i in (3, 5):
        assert store.get_sync(keys[i]) == data[i]
    assert store.segments.delete_many(keys[:3]) == {}, "deleted already: nothing to do"
    assert len(punched) == 2
    anyio.run(store.aclose)  # the writer lets go of its segment
    assert store.segments.delete_many([keys[3], keys[5]]) == {}
    assert segment_files(tmp_path) == [], "no record left, nobody holding it"


def test_delete_many_without_holes_makes_each_record_unfound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalObjectStore(str(tmp_path), segments=True)
    keys = [put_packed(store, os.urandom(2 * PAGE)) for _ in range(3)]
    monkeypatch.setattr(segments, "_punch", lambda fd, start, length: False)  # no support
    assert store.segments.delete_many(keys[:2]) == {}
    assert [i.key for i in listed(store)] == [keys[2]]
    for key in keys[:2]:
        with pytest.raises(ObjectNotFoundError):
            store.get_sync(key)


def test_a_range_stream_keeps_its_record_from_a_delete(tmp_path: Path) -> None:
    store = LocalObjectStore(str(tmp_path), segments=True)
    data = os.urandom(5 * PAGE)
    key = put_packed(store, data)
    stream = store.open_range_stream(key, 0)
    try:
        delete(store, key)  # left for the orphan sweep
        assert stream.read(10**6) == data
        assert store.get_sync(key) == data
    finally:
        stream.close()
    assert [i.key for i in listed(store)] == [key], "found again by the sweep"
    delete(store, key)
    assert listed(store) == []


def test_segments_roll_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(segments, "SEGMENT_BYTES", 8 * PAGE)
    store = LocalObjectStore(str(tmp_path), segments=True)
    data = [os.urandom(2 * PAGE) for _ in range(5)]
    keys = [put_packed(store, d) for d in data]
    assert len(segment_files(tmp_path)) >= 2
    for key, d in zip(keys, data, strict=True):
        assert store.get_sync(key) == d
    for key in keys:
        delete(store, key)
    assert len(segment_files(tmp_path)) == 1, "only the one still open stays"


def test_no_data_passes_for_a_head(tmp_path: Path) -> None:
    """Bytes at a page boundary shaped as a record's head count only with the segment's
    own nonce: a torn write's data (a client's records) never lists as an object, which
    the orphan sweep would then punch out of the file."""
    store = LocalObjectStore(str(tmp_path), segments=True)
    real = put_packed(store, b"real")
    (segment,) = segment_files(tmp_path)
    torn = store.new_key("ingest/", 2 * PAGE)  # reserved, never written: a crash
    offset = int(torn.rsplit("~", 1)[1])
    forged_key = "ingest/forged"
    wrong_nonce = bytes(segments.NONCE_BYTES)
    with open(segment, "r+b") as f:
        f.seek(offset + PAGE)
        f.write(segments._encode_head(wrong_nonce, forged_key, 10, time.time_ns()))
    assert [i.key for i in listed(store)] == [real]
    nonce = segment.read_bytes()[8 : 8 + segments.NONCE_BYTES]
    with open(segment, "r+b") as f:  # the control: with the nonce, it would count
        f.seek(offset + PAGE)
        f.write(segments._encode_head(nonce, forged_key, 10, time.time_ns()))
    assert sorted(i.key for i in listed(store)) == sorted([real, forged_key])


WRITER = textwrap.dedent(
    """
    import os, sys, time
    from storage.local import LocalObjectStore
    store = LocalObjectStore(sys.argv[1], segments=True)
    for n in range(20):
        data = bytes([n]) * (1000 + n)
        key = store.new_key("ingest/", len(data))
        store.put_sync(key, data, if_absent=True)
        print(key, flush=True)
    store.new_key("ingest/", 5000)  # reserved, never written
    print("done", flush=True)
    time.sleep(60)
    """
)


def start_writer(root: Path) -> tuple[subprocess.Popen[str], list[str]]:
    """A process that wrote WRITER's 20 records into root and holds its segment."""
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert writer.stdout is not None
    keys = [writer.stdout.readline().strip() for _ in range(20)]
    assert writer.stdout.readline() == "done\n"
    return writer, keys


def test_a_killed_writer_loses_no_record_it_wrote(tmp_path: Path) -> None:
    writer, keys = start_writer(tmp_path)
    try:
        store = LocalObjectStore(str(tmp_path))
        delete(store, keys[0])
        assert len(segment_files(tmp_path)) == 1
        writer.send_signal(signal.SIGKILL)
    finally:
        writer.wait()
    for n, key in enumerate(keys[1:], start=1):
        assert store.get_sync(key) == bytes([n]) * (1000 + n)
    assert [i.key for i in listed(store)] == keys[1:]
    for key in keys[1:]:
        delete(store, key)
    assert segment_files(tmp_path) == [], "its writer gone, the last delete unlinks it"


def test_a_dead_writers_emptied_segment_goes_at_the_next_list(tmp_path: Path) -> None:
    writer, keys = start_writer(tmp_path)
    try:
        store = LocalObjectStore(str(tmp_path))
        for key in keys:
            delete(store, key)
        assert len(segment_files(tmp_path)) == 1, "its writer holds it"
        writer.send_signal(signal.SIGKILL)
    finally:
        writer.wait()
    assert len(segment_files(tmp_path)) == 1
    assert listed(store) == []
    assert segment_files(tmp_path) == []


def test_a_place_is_reserved_without_io_and_a_failed_segment_is_left(tmp_path: Path) -> None:
    """new_key runs on the event loop: it makes no file. The first write makes the
    segment's; a segment whose file cannot be made takes no more places."""
    store = LocalObjectStore(str(tmp_path), segments=True)
    key = store.new_key("ingest/", 10)
    assert not (tmp_path / SEGMENT_FOLDER).exists()
    (tmp_path / SEGMENT_FOLDER).write_bytes(b"in the way")  # a file where the folder goes
    with pytest.raises(ObjectStoreError):
        store.put_sync(key, b"0123456789", if_absent=True)
    (tmp_path / SEGMENT_FOLDER).unlink()
    again = store.new_key("ingest/", 10)
    assert again.rsplit("~", 2)[1] != key.rsplit("~", 2)[1], "a new segment"
    store.put_sync(again, b"0123456789", if_absent=True)
    assert store.get_sync(again) == b"0123456789"
    with pytest.raises(ObjectNotFoundError):
        store.get_sync(key)
