"""The ObjectStore contract, run against every store (local folder and S3 via moto)."""

from __future__ import annotations

import os

import anyio
import pytest

from storage.objectstore import ObjectExistsError, ObjectNotFoundError, ObjectStore


async def test_put_get_round_trip(store: ObjectStore) -> None:
    await store.put("a/b/c", b"hello world")
    assert await store.get("a/b/c") == b"hello world"


async def test_empty_object(store: ObjectStore) -> None:
    await store.put("empty", b"")
    assert await store.get("empty") == b""
    assert await store.get("empty", 0, 0) == b""
    assert await store.get("empty", -4) == b""


async def test_ranged_gets(store: ObjectStore) -> None:
    data = bytes(range(100))
    await store.put("ranges", data)
    assert await store.get("ranges", 10) == data[10:]
    assert await store.get("ranges", 10, 20) == data[10:20]
    assert await store.get("ranges", 0, 1) == data[:1]
    assert await store.get("ranges", 99, 100) == data[99:]
    assert await store.get("ranges", 90, 200) == data[90:], "a range past the end is cut short"
    assert await store.get("ranges", 100) == b""
    assert await store.get("ranges", 150) == b""
    assert await store.get("ranges", 150, 160) == b""


async def test_empty_range(store: ObjectStore) -> None:
    await store.put("ranges", b"0123456789")
    assert await store.get("ranges", 5, 5) == b""
    assert await store.get("ranges", 0, 0) == b""
    with pytest.raises(ObjectNotFoundError):
        await store.get("missing", 5, 5)


async def test_suffix_range(store: ObjectStore) -> None:
    await store.put("tail", b"0123456789")
    assert await store.get("tail", -3) == b"789"
    assert await store.get("tail", -10) == b"0123456789"
    assert await store.get("tail", -50) == b"0123456789", "a longer suffix is the whole object"


async def test_bad_ranges_are_rejected(store: ObjectStore) -> None:
    await store.put("x", b"0123456789")
    with pytest.raises(ValueError):
        await store.get("x", 5, 4)
    with pytest.raises(ValueError):
        await store.get("x", -3, 9)


async def test_if_absent_conflict_keeps_original(store: ObjectStore) -> None:
    await store.put("once", b"first", if_absent=True)
    with pytest.raises(ObjectExistsError):
        await store.put("once", b"second", if_absent=True)
    assert await store.get("once") == b"first"


async def test_put_sync_from_a_worker_thread(store: ObjectStore) -> None:
    puts = store.stats["puts"]  # type: ignore[attr-defined]
    await anyio.to_thread.run_sync(lambda: store.put_sync("sync/one", b"first", if_absent=True))
    assert await store.get("sync/one") == b"first"
    with pytest.raises(ObjectExistsError):
        await anyio.to_thread.run_sync(
            lambda: store.put_sync("sync/one", b"second", if_absent=True)
        )
    await anyio.to_thread.run_sync(lambda: store.put_sync("sync/one", b"third"))
    assert await store.get("sync/one") == b"third"
    assert store.stats["puts"] == puts + 3  # type: ignore[attr-defined]


async def test_get_sync_from_a_worker_thread(store: ObjectStore) -> None:
    await store.put("sync/read", b"0123456789")
    gets = store.stats["gets"]  # type: ignore[attr-defined]
    assert await anyio.to_thread.run_sync(lambda: store.get_sync("sync/read")) == b"0123456789"
    assert await anyio.to_thread.run_sync(lambda: store.get_sync("sync/read", 2, 5)) == b"234"
    assert await anyio.to_thread.run_sync(lambda: store.get_sync("sync/read", -3)) == b"789"
    with pytest.raises(ObjectNotFoundError):
        await anyio.to_thread.run_sync(lambda: store.get_sync("sync/missing"))
    assert store.stats["gets"] == gets + 4  # type: ignore[attr-defined]


async def test_overwrite_without_if_absent(store: ObjectStore) -> None:
    await store.put("k", b"first")
    await store.put("k", b"second, longer")
    assert await store.get("k") == b"second, longer"
    await store.put("k", b"3")
    assert await store.get("k") == b"3"


async def test_delete_is_idempotent(store: ObjectStore) -> None:
    await store.put("gone/soon", b"x")
    await store.delete("gone/soon")
    await store.delete("gone/soon")
    await store.delete("never/was")
    with pytest.raises(ObjectNotFoundError):
        await store.get("gone/soon")
    assert await store.list("gone/") == []
    await store.put("gone/soon", b"back", if_absent=True)
    assert await store.get("gone/soon") == b"back"


async def test_delete_many_deletes_each_key_and_takes_missing_ones(store: ObjectStore) -> None:
    for i in range(5):
        await store.put(f"many/{i}", b"x" * i)
    failed = await store.delete_many(["many/0", "many/2", "many/4", "never/was", "many/2"])
    assert failed == {}
    assert [info.key for info in await store.list("many/")] == ["many/1", "many/3"]
    with pytest.raises(ObjectNotFoundError):
        await store.get("many/2")
    assert await store.delete_many([]) == {}
    assert await store.delete_many(["many/1", "many/3"]) == {}
    assert await store.list("many/") == []


async def test_get_missing(store: ObjectStore) -> None:
    with pytest.raises(ObjectNotFoundError):
        await store.get("no/such/key")
    with pytest.raises(ObjectNotFoundError):
        await store.get("no-such-key", 3, 9)
    with pytest.raises(ObjectNotFoundError):
        await store.get("no-such-key", -12)


async def test_list_prefix_and_order(store: ObjectStore) -> None:
    keys = ["ingest/02", "ingest/01", "ingest/10", "ingestion", "other/01", "ingest/sub/03"]
    for index, key in enumerate(keys):
        await store.put(key, b"x" * index)
    listed = await store.list("ingest/")
    assert [info.key for info in listed] == ["ingest/01", "ingest/02", "ingest/10", "ingest/sub/03"]
    assert [info.size for info in listed] == [1, 0, 2, 5]
    assert all(info.last_modified > 0 for info in listed)
    assert [info.key for info in await store.list("ingest")] == [
        "ingest/01",
        "ingest/02",
        "ingest/10",
        "ingest/sub/03",
        "ingestion",
    ]
    assert [info.key for info in await store.list("ingest/1")] == ["ingest/10"]
    assert [info.key for info in await store.list("ingest/s")] == ["ingest/sub/03"]
    assert [info.key for info in await store.list()] == sorted(keys)
    assert await store.list("nothing/") == []


async def test_list_after_a_key_and_the_folders_below_a_prefix(store: ObjectStore) -> None:
    keys = ["j/a/0001", "j/a/0002", "j/a/0003", "j/b/0001", "j/c/x/0001", "jx/0001"]
    for key in keys:
        await store.put(key, b"x")
    after = await store.list("j/a/", start_after="j/a/0001")
    assert [info.key for info in after] == ["j/a/0002", "j/a/0003"]
    assert await store.list("j/a/", start_after="j/a/0003") == []
    assert [i.key for i in await store.list("j/", start_after="j/b")] == ["j/b/0001", "j/c/x/0001"]
    assert await store.list_folders("j/") == ["a", "b", "c"]
    assert await store.list_folders("j/c/") == ["x"]
    assert await store.list_folders("nothing/") == []
    for key in ["j/b/0001"]:
        await store.delete(key)
    assert await store.list_folders("j/") == ["a", "c"]  # a folder with nothing left is gone


async def test_large_object(store: ObjectStore) -> None:
    data = os.urandom(8 * 1024 * 1024)
    await store.put("big", data, if_absent=True)
    assert await store.get("big") == data
    assert await store.get("big", 3_000_000, 5_000_001) == data[3_000_000:5_000_001]
    assert await store.get("big", -100) == data[-100:]
    assert [info.size for info in await store.list("big")] == [len(data)]


async def test_concurrent_if_absent_exactly_one_wins(store: ObjectStore) -> None:
    for round_ in range(3):
        key = f"race/{round_}"
        winners: list[bytes] = []

        async def attempt(payload: bytes, key: str = key, winners: list[bytes] = winners) -> None:
            try:
                await store.put(key, payload, if_absent=True)
            except ObjectExistsError:
                return
            winners.append(payload)

        async with anyio.create_task_group() as tg:
            for writer in range(8):
                tg.start_soon(attempt, f"writer {writer} ".encode() * 1000)
        assert len(winners) == 1
        assert await store.get(key) == winners[0]


async def test_stats_count_calls(store: ObjectStore) -> None:
    stats: dict[str, int] = store.stats  # type: ignore[attr-defined]
    await store.put("s", b"12345")
    await store.get("s", 1, 3)
    await store.list()
    await store.delete("s")
    assert stats == {
        "puts": 1,
        "gets": 1,
        "deletes": 1,
        "lists": 1,
        "bytes_put": 5,
        "bytes_got": 2,
    }


async def test_a_range_stream_reads_on_in_order_up_to_its_end(store: ObjectStore) -> None:
    """One GET read as wanted (read-ahead's streams), to the object's end or to an end
    given when it is opened."""
    data = bytes(range(256)) * 64
    await store.put("streamed", data)
    open_stream = store.open_range_stream  # type: ignore[attr-defined]
    to_end = await anyio.to_thread.run_sync(open_stream, "streamed", 100)
    bounded = await anyio.to_thread.run_sync(open_stream, "streamed", 1000, 3000)
    try:
        assert to_end.read(900) == data[100:1000]
        assert to_end.read(len(data)) == data[1000:]
        assert bounded.read(1500) == data[1000:2500]
        assert bounded.read(len(data)) == data[2500:3000]
        assert bounded.read(10) == b""
    finally:
        to_end.close()
        bounded.close()


async def test_a_view_holds_what_get_returns(store: ObjectStore) -> None:
    """get_view answers every range get answers, as a read-only view: small ranges and
    ones large enough for the local store to map, suffixes, ranges past the end."""
    data = os.urandom(3 * 1024 * 1024 + 123)
    await store.put("viewed", data, if_absent=True)
    ranges = [(0, None), (0, 10), (5, 300_000), (4097, 2_500_000), (-700_000, None)]
    ranges += [(len(data) - 5, len(data) + 50), (len(data) + 1, len(data) + 9), (7, 7)]
    for start, end in ranges:
        view = await store.get_view("viewed", start, end)
        assert view.readonly
        assert view == await store.get("viewed", start, end), (start, end)
        in_thread = await anyio.to_thread.run_sync(store.get_view_sync, "viewed", start, end)
        assert in_thread == data[start:end] if end is not None else data[start:]
    with pytest.raises(ObjectNotFoundError):
        await store.get_view("missing", 0, 300_000)


async def test_an_object_put_in_parts_is_their_bytes_in_order(store: ObjectStore) -> None:
    """put_parts_sync stores the parts' bytes as one object: parts of any size, views
    among them, more parts than one writev takes, parts across the pieces a store writes
    at a time."""
    blob = os.urandom(3 * 1024 * 1024 + 5)
    shapes = {
        "one": [blob],
        "mixed": [b"head", memoryview(blob)[: 1 << 20], b"", memoryview(blob)[1 << 20 :], b"end"],
        "many": [blob[i : i + 700] for i in range(0, 2_000 * 700, 700)],
        "small": [b"a", b"", b"bc"],
        "none": [],
    }
    for name, parts in shapes.items():
        await anyio.to_thread.run_sync(
            lambda parts=parts, name=name: store.put_parts_sync(name, parts, if_absent=True)
        )
        assert await store.get(name) == b"".join(parts), name
    with pytest.raises(ObjectExistsError):
        await anyio.to_thread.run_sync(
            lambda: store.put_parts_sync("small", [b"other"], if_absent=True)
        )
    assert await store.get("small") == b"abc"
