"""What an agent logs about expected events: bad input and clients that go away.

Each is one line naming the peer (and the API and version when the header parsed) with
the reason, at WARNING or INFO, at most a burst of lines per window for each kind of
event, and a counter in the agent's stats file. Tracebacks are for bugs only.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from pathlib import Path

import pytest

from protocol.records import build_batch
from tests.e2e.rawclient import ensure_topic
from tests.e2e.wire import WireClient, metadata, produce, raw_frame, request
from tests.support.brokerproc import BrokerProcess

pytestmark = [pytest.mark.slow, pytest.mark.store_independent]

METADATA, FETCH = 3, 1
BAD_REQUESTS = 60
# At most this many lines per kind of event in one window (broker.eventlog.BURST).
BURST = 10


def _counters(broker: BrokerProcess, timeout: float = 10.0) -> dict[str, int]:
    """The agent's connection counters once its stats file has them (written each second)."""
    path = Path(broker.data_dir) / f"stats-{broker.port}.json"
    deadline = time.monotonic() + timeout
    while True:
        try:
            counters = json.loads(path.read_text()).get("connections")
        except (OSError, ValueError):
            counters = None
        if counters or time.monotonic() > deadline:
            return counters or {}
        time.sleep(0.1)


def _wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_malformed_requests_are_counted_and_logged_without_tracebacks(start_broker) -> None:
    broker = start_broker()
    # A Metadata v12 request whose body stops after one byte: the header parses, the body
    # does not.
    frame = raw_frame(METADATA, 12, 7, b"\x05", flexible_header=True)
    for _ in range(BAD_REQUESTS):
        with WireClient(broker.bootstrap) as client:
            client.send_raw(frame)
            assert client.wait_closed()
    with WireClient(broker.bootstrap) as client:  # the agent serves on
        assert metadata(client, None).brokers
    log = broker.log_text()
    assert "Traceback" not in log, log[-3000:]
    lines = [line for line in log.splitlines() if "MetadataRequest v12" in line]
    assert lines, log[-2000:]
    assert all(" WARNING " in line and "127.0.0.1:" in line for line in lines), lines
    # Rate-limited: a burst, then a count of what was left out.
    assert len(lines) <= BURST + 1, lines
    _wait_for(lambda: _counters(broker).get("malformed_requests") == BAD_REQUESTS)


def test_clients_that_disconnect_while_answered_leave_no_tracebacks(start_broker) -> None:
    broker = start_broker()
    ensure_topic(broker.port, "big")
    value = b"x" * 900_000
    with WireClient(broker.bootstrap) as client:
        for _ in range(8):
            answer = produce(client, {"big": {0: build_batch([(None, value, [], 0)])}})
            assert answer["big", 0].error_code == 0
    fetch_request = request(
        FETCH,
        12,
        replica_id=-1,
        max_wait=0,
        min_bytes=0,
        max_bytes=64 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        forgotten_topics_data=[],
        rack_id="",
        topics=[
            {
                "topic": "big",
                "partitions": [
                    {
                        "partition": 0,
                        "fetch_offset": 0,
                        "partition_max_bytes": 64 << 20,
                        "log_start_offset": -1,
                        "current_leader_epoch": -1,
                    }
                ],
            }
        ],
    )
    for _ in range(30):
        client = WireClient(broker.bootstrap)
        client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.send(fetch_request)
        time.sleep(0.02)  # the agent is writing its ~7 MB answer into a full socket
        # Close with a reset (linger 0), as a killed client's kernel does.
        client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()
    time.sleep(1)
    with WireClient(broker.bootstrap) as client:
        assert metadata(client, None).brokers
    log = broker.log_text()
    assert "Traceback" not in log, log[-3000:]
    assert " ERROR " not in log, log[-3000:]
    lines = [line for line in log.splitlines() if "went away" in line]
    assert 0 < len(lines) <= BURST + 1, lines
    assert all(" INFO " in line for line in lines), lines
    _wait_for(lambda: _counters(broker).get("client_disconnects", 0) > 0)
