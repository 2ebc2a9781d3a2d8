"""`serve --event-loop`: uvloop where installed by default, the standard library's loop on
request, a clear refusal of uvloop where it is missing; an agent answers on either loop."""

from __future__ import annotations

import pytest
from kafka import KafkaConsumer, KafkaProducer

from broker import cli
from tests.support.brokerproc import BrokerProcess

uvloop = pytest.importorskip("uvloop", reason="uvloop is not installed")


def test_unknown_loop_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["serve", "--event-loop", "trio"])
    assert exited.value.code == 2
    assert "--event-loop" in capsys.readouterr().err


def test_uvloop_asked_for_but_missing_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "_uvloop_installed", lambda: False)
    with pytest.raises(SystemExit) as exited:
        cli.main(["serve", "--event-loop", "uvloop", "--data-dir", str(tmp_path)])
    assert exited.value.code == 2
    assert "uvloop is not installed" in capsys.readouterr().err


def _round_trip(broker: BrokerProcess, topic: str) -> list[bytes]:
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
    for i in range(20):
        producer.send(topic, f"r{i}".encode())
    producer.flush(timeout=30)
    producer.close()
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=broker.bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=10_000,
    )
    try:
        values = []
        for record in consumer:
            values.append(record.value)
            if len(values) == 20:
                break
        return values
    finally:
        consumer.close()


@pytest.mark.store_independent
@pytest.mark.parametrize("choice, loop", [([], "uvloop"), (["--event-loop", "asyncio"], "asyncio")])
def test_agent_serves_on_the_chosen_loop(start_broker, choice: list[str], loop: str) -> None:
    broker = start_broker(extra_args=choice)
    assert _round_trip(broker, "loops") == [f"r{i}".encode() for i in range(20)]
    assert f"event loop: {loop}" in broker.log_text()
