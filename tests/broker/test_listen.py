"""The agent's listener: a port held for a moment (an outgoing connection that took
it) is tried again; one held for good is a clear exit."""

from __future__ import annotations

import socket

import anyio
import pytest

from broker import server


def _hold_port() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


async def test_a_port_freed_soon_is_listened_on() -> None:
    held = _hold_port()
    port = held.getsockname()[1]

    async def free() -> None:
        await anyio.sleep(0.3)
        held.close()

    async with anyio.create_task_group() as tg:
        tg.start_soon(free)
        listener = await server._listen("127.0.0.1", port)
    await listener.aclose()


async def test_a_port_held_for_good_ends_the_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "LISTEN_RETRY_SECONDS", 0.3)
    held = _hold_port()
    try:
        with pytest.raises(SystemExit, match="cannot listen on 127.0.0.1"):
            await server._listen("127.0.0.1", held.getsockname()[1])
    finally:
        held.close()
