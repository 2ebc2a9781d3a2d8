"""S3 (or any S3-compatible API) as an object store.

Rules:
- Keys live under `prefix/` in one bucket; list() strips the prefix again.
- boto3 is blocking: every async call runs in a worker thread, at most max_concurrency
  at once. The *_sync calls come from threads of their own, outside that limit (flush
  uploads, their hedges, compaction and cleaning jobs), so the HTTP pool keeps
  `blocking_calls` more connections than max_concurrency (the agent counts its own,
  broker.agent.blocking_store_calls): a pool smaller than the requests in flight opens a
  connection per request beyond it and drops it after.
- botocore's "standard" retry mode retries 5xx, SlowDown/throttling and connection
  errors with jittered exponential backoff. What it cannot see is retried here: a
  body that breaks off while being read, and 409 ConditionalRequestConflict.
- Its wait before attempt i+1 is rand(0, 1) x min(base x 2^i, cap): base 1 s after a
  throttling answer (SlowDown), 50 ms after others, and botocore's cap is 20 s. Here
  the cap is `max_retry_delay_s` (MAX_RETRY_DELAY_S, 2 s): a produce waits for its
  flush's PUT, and flushes commit in order, so one PUT asleep for up to 20 s after a
  burst of SlowDowns held every produce of the agent that long after S3 answered
  again. Eight attempts now wait at most 14 s in all, inside a producer's 30 s
  request timeout. botocore's retry quota still stops retrying while most requests
  fail, which is what keeps the load on a throttling S3 down.
- put(if_absent=True) sends If-None-Match: *, so S3 itself refuses to overwrite;
  412 becomes ObjectExistsError. If botocore had retried that PUT, the 412 may be
  our own earlier attempt having landed (its answer lost): if the object's ETag is
  our MD5, it holds exactly our bytes and the put counts as done.
- Stores without conditional writes: one that answers 501 NotImplemented to
  If-None-Match gets plain PUTs from then on (logged once); one that ignores the
  header simply overwrites. Both are safe for bucketlog because every object key is
  a fresh ULID made by its one writer: no other writer ever puts that key, so an
  overwrite can only be this writer's own retry of the same bytes. if_absent is a
  safety net against bugs, not what keeps writers apart.
- Credentials come from the usual AWS chain (environment, shared config and
  credentials files, SSO, container and instance roles). The region is `region`,
  else the chain's (AWS_REGION, the profile). Addressing: `addressing_style` "path"
  (http://host/bucket/key), "virtual" (http://bucket.host/key) or "auto" (botocore:
  virtual where the bucket name allows it); by default "path" with an explicit
  endpoint_url (MinIO, moto: virtual hosts need DNS for every bucket) and "auto" on
  AWS.
"""

from __future__ import annotations

import builtins
import hashlib
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    IncompleteReadError,
    ReadTimeoutError,
    ResponseStreamingError,
)
from botocore.retries import quota, standard

from storage.ingest import new_object_key
from storage.objectstore import (
    DELETE_BATCH_MAX,
    ObjectExistsError,
    ObjectInfo,
    ObjectNotFoundError,
    ObjectStoreError,
    new_stats,
)

log = logging.getLogger(__name__)

_T = TypeVar("_T")

# Errors raised while reading a response body, after botocore's retry loop is done.
_BODY_ERRORS = (ResponseStreamingError, IncompleteReadError, ReadTimeoutError)
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})

ADDRESSING_STYLES = ("auto", "path", "virtual")
# Connections of the client that serves open range streams (read-ahead of catch-ups).
STREAM_CONNECTIONS = 256
# Connections kept beyond max_concurrency, by default, for the blocking calls made outside
# its limit (what an agent with the default settings makes at most).
BLOCKING_CALLS = 18
# The longest wait between two attempts of one request (botocore's own: 20 s).
MAX_RETRY_DELAY_S = 2.0


class S3ObjectStore:
    """Objects in an S3 bucket under a key prefix."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        addressing_style: str | None = None,
        max_concurrency: int = 16,
        blocking_calls: int = BLOCKING_CALLS,
        max_attempts: int = 8,
        max_retry_delay_s: float = MAX_RETRY_DELAY_S,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        list_page_size: int = 1000,
        client: Any = None,
    ) -> None:
        self.bucket = bucket
        prefix = prefix.strip("/")
        self.prefix = prefix + "/" if prefix else ""
        self.max_attempts = max_attempts
        self.list_page_size = list_page_size
        if addressing_style is None:
            addressing_style = "path" if endpoint_url else "auto"
        if addressing_style not in ADDRESSING_STYLES:
            raise ValueError(
                f"S3 addressing style must be one of {ADDRESSING_STYLES}, not {addressing_style!r}"
            )
        # False once the store said it does not implement If-None-Match.
        self.conditional_writes = True

        def new_client(connections: int) -> Any:
            config = Config(
                retries={"mode": "standard", "total_max_attempts": max_attempts},
                max_pool_connections=connections,
                connect_timeout=connect_timeout,
                read_timeout=read_timeout,
                s3={"addressing_style": addressing_style},
            )
            # A session per client: boto3's default session is not thread-safe to create.
            made = boto3.session.Session().client(
                "s3", endpoint_url=endpoint_url, region_name=region, config=config
            )
            _cap_retry_delay(made, max_attempts, max_retry_delay_s)
            return made

        self._new_client = new_client if client is None else (lambda connections: client)
        if client is None:
            client = new_client(max_concurrency + blocking_calls)
        self._client = client
        self._stream_client: Any = None
        self._stream_client_lock = threading.Lock()
        self._limiter = anyio.CapacityLimiter(max_concurrency)
        self.stats = new_stats()

    def __repr__(self) -> str:
        return f"S3ObjectStore(s3://{self.bucket}/{self.prefix})"

    async def put(self, key: str, data: bytes, *, if_absent: bool = False) -> None:
        await anyio.to_thread.run_sync(
            partial(self.put_sync, key, data, if_absent=if_absent), limiter=self._limiter
        )

    def new_key(self, prefix: str, size: int) -> str:
        return new_object_key(prefix)

    def put_sync(self, key: str, data: bytes, *, if_absent: bool = False) -> None:
        self.put_parts_sync(key, (data,), if_absent=if_absent)

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes [start, end) of the object; a negative start means the last -start bytes."""
        _check_range(start, end)
        self.stats["gets"] += 1
        data = await self._run(partial(self._get, key, start, end))
        self.stats["bytes_got"] += len(data)
        return data

    def get_sync(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        _check_range(start, end)
        self.stats["gets"] += 1
        data = self._wrapped(partial(self._get, key, start, end))
        self.stats["bytes_got"] += len(data)
        return data

    def put_parts_sync(
        self, key: str, parts: Sequence[bytes | memoryview], *, if_absent: bool = False
    ) -> None:
        """put_sync of the parts joined, sent from the parts as they are (`_PartsBody`)."""
        self.stats["puts"] += 1
        self._wrapped(partial(self._put, key, parts, if_absent))
        self.stats["bytes_put"] += sum(len(part) for part in parts)

    async def get_view(self, key: str, start: int = 0, end: int | None = None) -> memoryview:
        """get()'s bytes as a view (a GET's body is a copy of the store's anyway)."""
        return memoryview(await self.get(key, start, end))

    def get_view_sync(self, key: str, start: int = 0, end: int | None = None) -> memoryview:
        return memoryview(self.get_sync(key, start, end))

    def open_range_stream(self, key: str, start: int, end: int | None = None) -> _S3RangeStream:
        """The object from `start` on (to `end`, or its end), as one GET read as wanted
        (blocking: in a worker thread). Streams have their own connections
        (STREAM_CONNECTIONS), so that open ones never take the pool of the other
        requests."""
        _check_range(start, end)
        self.stats["gets"] += 1
        if self._stream_client is None:
            with self._stream_client_lock:
                if self._stream_client is None:
                    self._stream_client = self._new_client(STREAM_CONNECTIONS)
        response = self._wrapped(
            partial(
                self._call,
                key,
                self._stream_client.get_object,
                Bucket=self.bucket,
                Key=self.prefix + key,
                Range=f"bytes={start}-" if end is None else f"bytes={start}-{end - 1}",
            )
        )
        return _S3RangeStream(self, key, response["Body"])

    async def delete(self, key: str) -> None:
        self.stats["deletes"] += 1
        await self._run(partial(self._delete, key))

    async def delete_many(self, keys: Sequence[str]) -> dict[str, Exception]:
        """DeleteObjects, up to S3's 1,000 keys a request."""
        failed: dict[str, Exception] = {}
        keys = list(dict.fromkeys(keys))  # each once: a request names a key at most once
        for at in range(0, len(keys), DELETE_BATCH_MAX):
            chunk = keys[at : at + DELETE_BATCH_MAX]
            self.stats["deletes"] += 1
            try:
                failed.update(await self._run(partial(self._delete_objects, chunk)))
            except ObjectStoreError as exc:  # the request failed: every key of it did
                failed.update((key, exc) for key in chunk)
        return failed

    async def list(self, prefix: str = "", *, start_after: str = "") -> list[ObjectInfo]:
        self.stats["lists"] += 1
        return await self._run(partial(self._list, prefix, start_after))

    async def list_folders(self, prefix: str) -> builtins.list[str]:
        self.stats["lists"] += 1
        return await self._run(partial(self._list_folders, prefix))

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self._client.close, limiter=self._limiter)
        if self._stream_client is not None and self._stream_client is not self._client:
            await anyio.to_thread.run_sync(self._stream_client.close, limiter=self._limiter)

    async def _run(self, func: Callable[[], _T]) -> _T:
        return await anyio.to_thread.run_sync(self._wrapped, func, limiter=self._limiter)

    def _wrapped(self, func: Callable[[], _T]) -> _T:
        """func(), with a failure of S3 or of the connection raised as ObjectStoreError."""
        try:
            return func()
        except ObjectStoreError:
            raise
        except (ClientError, BotoCoreError) as exc:
            raise ObjectStoreError(f"{self!r}: {exc}") from exc

    # The methods below run in worker threads.

    def _put(self, key: str, parts: Sequence[bytes | memoryview], if_absent: bool) -> None:
        for attempt in range(1, self.max_attempts + 1):
            conditional = if_absent and self.conditional_writes
            extra = {"IfNoneMatch": "*"} if conditional else {}
            body = parts[0] if len(parts) == 1 and isinstance(parts[0], bytes) else None
            try:
                self._client.put_object(
                    Bucket=self.bucket,
                    Key=self.prefix + key,
                    Body=_PartsBody(parts) if body is None else body,
                    **extra,
                )
                return
            except ClientError as exc:
                code, status = _error_code(exc), _status(exc)
                if conditional and (code == "NotImplemented" or status == 501):
                    # Safe without the condition: object keys are unique per writer.
                    log.warning(
                        "%r does not implement conditional writes (If-None-Match); "
                        "writing new objects with plain PUTs",
                        self,
                    )
                    self.conditional_writes = False
                    continue
                if code == "PreconditionFailed" or status == 412:
                    if _retry_attempts(exc) and self._holds(key, parts):
                        return
                    raise ObjectExistsError(f"object already exists: {key!r}") from None
                # Another conditional write of this key is in flight; AWS says retry.
                if code == "ConditionalRequestConflict" or status == 409:
                    if attempt == self.max_attempts:
                        raise ObjectExistsError(
                            f"conditional write of {key!r} kept conflicting"
                        ) from exc
                    log.debug("conditional put of %r conflicts; retrying", key)
                    _backoff(attempt)
                    continue
                raise
        raise AssertionError("unreachable")

    def _holds(self, key: str, parts: Sequence[bytes | memoryview]) -> bool:
        """True if the stored object is byte for byte the parts joined (single-part ETag
        = MD5)."""
        try:
            head = self._client.head_object(Bucket=self.bucket, Key=self.prefix + key)
        except ClientError:
            return False
        etag = str(head.get("ETag", "")).strip('"')
        md5 = hashlib.md5(usedforsecurity=False)
        for part in parts:
            md5.update(part)
        return etag == md5.hexdigest()

    def _get(self, key: str, start: int, end: int | None) -> bytes:
        full_key = self.prefix + key
        if end is not None and end == start:
            # An empty range has no HTTP form; still say whether the object exists.
            self._call(key, self._client.head_object, Bucket=self.bucket, Key=full_key)
            return b""
        extra: dict[str, str] = {}
        if start < 0:
            extra["Range"] = f"bytes={start}"  # suffix range: the last -start bytes
        elif end is not None:
            extra["Range"] = f"bytes={start}-{end - 1}"
        elif start > 0:
            extra["Range"] = f"bytes={start}-"
        for attempt in range(1, self.max_attempts + 1):
            try:
                response = self._call(
                    key, self._client.get_object, Bucket=self.bucket, Key=full_key, **extra
                )
            except ClientError as exc:
                if _error_code(exc) == "InvalidRange" or _status(exc) == 416:
                    return b""  # the object exists, the range starts past its end
                raise
            try:
                body: bytes = response["Body"].read()
                return body
            except _BODY_ERRORS:
                if attempt == self.max_attempts:
                    raise
                log.debug("reading %r broke off; retrying", key)
                _backoff(attempt)
        raise AssertionError("unreachable")

    def _delete(self, key: str) -> None:
        try:
            self._client.delete_object(Bucket=self.bucket, Key=self.prefix + key)
        except ClientError as exc:
            if _error_code(exc) not in _NOT_FOUND_CODES:
                raise

    def _delete_objects(self, keys: Sequence[str]) -> dict[str, Exception]:
        response = self._client.delete_objects(
            Bucket=self.bucket,
            Delete={"Objects": [{"Key": self.prefix + key} for key in keys], "Quiet": True},
        )
        failed: dict[str, Exception] = {}
        for error in response.get("Errors", []):
            if error.get("Code") not in _NOT_FOUND_CODES:
                key = str(error.get("Key", ""))[len(self.prefix) :]
                failed[key] = ObjectStoreError(
                    f"delete {key!r}: {error.get('Code')}: {error.get('Message', '')}"
                )
        return failed

    # builtins.list: in this class body, `list` is the method above.
    def _list(self, prefix: str, start_after: str = "") -> builtins.list[ObjectInfo]:
        paginator = self._client.get_paginator("list_objects_v2")
        found: builtins.list[ObjectInfo] = []
        cut = len(self.prefix)
        extra = {"StartAfter": self.prefix + start_after} if start_after else {}
        pages = paginator.paginate(
            Bucket=self.bucket,
            Prefix=self.prefix + prefix,
            PaginationConfig={"PageSize": self.list_page_size},
            **extra,
        )
        for page in pages:
            for item in page.get("Contents", ()):
                found.append(
                    ObjectInfo(
                        key=item["Key"][cut:],
                        size=int(item["Size"]),
                        last_modified=item["LastModified"].timestamp(),
                    )
                )
        found.sort(key=lambda info: info.key)
        return found

    def _list_folders(self, prefix: str) -> builtins.list[str]:
        paginator = self._client.get_paginator("list_objects_v2")
        cut = len(self.prefix + prefix)
        names = []
        pages = paginator.paginate(
            Bucket=self.bucket,
            Prefix=self.prefix + prefix,
            Delimiter="/",
            PaginationConfig={"PageSize": self.list_page_size},
        )
        for page in pages:
            for common in page.get("CommonPrefixes", ()):
                names.append(common["Prefix"][cut:].rstrip("/"))
        return sorted(names)

    def _call(self, key: str, method: Callable[..., Any], **kwargs: Any) -> Any:
        try:
            return method(**kwargs)
        except ClientError as exc:
            if _error_code(exc) in _NOT_FOUND_CODES:
                raise ObjectNotFoundError(f"no such object: {key!r}") from None
            raise


class _PartsBody:
    """A PUT's body: its parts one after the other, read as botocore reads a file (its
    length, read, tell, seek: to sign it where it signs bodies, to checksum it, to send
    it, and from the start again to retry). Never joined whole: an output of compaction
    is up to 64 MiB of parts, whose joined copy cost a second buffer that size per PUT,
    its pages faulted in (about 60 ms per 64 MiB here, more than reading it to sign
    it); a read copies only what it answers, and nothing when that lies in one part."""

    def __init__(self, parts: Sequence[bytes | memoryview]) -> None:
        self._parts = [memoryview(part).cast("B") for part in parts if len(part)]
        self._size = sum(len(part) for part in self._parts)
        self._index = 0  # the part the position is in (len(parts): the end)
        self._offset = 0  # the position in that part
        self._position = 0

    def __len__(self) -> int:
        return self._size

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = 0) -> int:
        target = offset + (0, self._position, self._size)[whence]
        if target < 0:
            raise ValueError(f"negative position {target}")
        self._index, self._offset, self._position = 0, 0, 0
        for part in self._parts:
            if self._position + len(part) > target:
                break
            self._position += len(part)
            self._index += 1
        self._offset = min(target, self._size) - self._position
        self._position += self._offset
        return self._position

    def read(self, size: int | None = -1) -> bytes | memoryview:
        """`size` bytes (all the rest: -1), fewer only at the end, as a file answers:
        what reads it may make a unit of each read (botocore's aws-chunked bodies, to
        S3 over https, send one chunk per read, and S3 refuses chunks under 8 KiB but
        the last). A view of the part where they lie in one, else their copy."""
        wanted = self._size - self._position if size is None or size < 0 else size
        pieces = []
        while wanted > 0 and self._index < len(self._parts):
            part = self._parts[self._index]
            view = part[self._offset : self._offset + wanted]
            pieces.append(view)
            wanted -= len(view)
            self._offset += len(view)
            self._position += len(view)
            if self._offset == len(part):
                self._index, self._offset = self._index + 1, 0
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)


class _S3RangeStream:
    """The body of one open GET, read in order (storage.objectstore.RangeStream)."""

    def __init__(self, store: S3ObjectStore, key: str, body: Any) -> None:
        self._store = store
        self._key = key
        self._body = body

    def read(self, n: int) -> bytes:
        chunks: list[bytes] = []
        wanted = n
        try:
            while wanted > 0:
                chunk: bytes = self._body.read(wanted)
                if not chunk:
                    break
                chunks.append(chunk)
                wanted -= len(chunk)
        except _BODY_ERRORS as exc:
            raise ObjectStoreError(
                f"{self._store!r}: reading {self._key!r} broke off: {exc}"
            ) from exc
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._store.stats["bytes_got"] += len(data)
        return data

    def close(self) -> None:
        self._body.close()


def _cap_retry_delay(client: Any, max_attempts: int, max_delay_s: float) -> None:
    """Replace the client's standard-mode retry handler by the same one with its waits
    capped at max_delay_s (botocore takes no cap in its Config). Registered under the
    handler's own unique id, so exactly one handler decides each retry."""
    service = client.meta.service_model.service_id.hyphenize()
    adapter = standard.RetryEventAdapter()
    throttling = standard.ThrottlingErrorDetector(adapter)
    retry_quota = standard.RetryQuotaChecker(quota.RetryQuota(), throttling)
    handler = standard.RetryHandler(
        retry_policy=standard.RetryPolicy(
            retry_checker=standard.StandardRetryConditions(max_attempts=max_attempts),
            retry_backoff=standard.ExponentialBackoff(
                max_backoff=max_delay_s, service_name=service, throttling_detector=throttling
            ),
        ),
        retry_event_adapter=adapter,
        retry_quota=retry_quota,
        service_name=service,
    )
    events = client.meta.events
    unique_id = f"retry-config-{service}"
    events.unregister(f"needs-retry.{service}", unique_id=unique_id)
    events.register(f"needs-retry.{service}", handler.needs_retry, unique_id=unique_id)
    events.register(f"after-call.{service}", retry_quota.release_retry_quota)


def _check_range(start: int, end: int | None) -> None:
    if start < 0 and end is not None:
        raise ValueError("a negative start (read from the end) needs end=None")
    if end is not None and end < start:
        raise ValueError(f"range end {end} is before start {start}")


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def _retry_attempts(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0))


def _backoff(attempt: int) -> None:
    # Full jitter, like botocore: up to 50 ms, 100 ms, 200 ms ... capped at 5 s.
    time.sleep(random.uniform(0, min(5.0, 0.05 * 2 ** (attempt - 1))))
