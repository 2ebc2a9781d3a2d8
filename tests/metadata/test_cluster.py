"""The agent registry: leases, deregistration by node id or by address, stable node ids.
Run on every backend."""

from __future__ import annotations

from metadata import cluster, keys

SUB = keys.cluster_subspace("test")
NOW = 1_700_000_000_000
LEASE = 2_500


def register(kv, port: int, expires: int = NOW + LEASE) -> int:
    return kv.transact_sync(
        lambda tr: cluster.register_agent(tr, SUB, "127.0.0.1", port, None, expires)
    )


def live_ports(kv, now: int = NOW) -> list[int]:
    return [a.port for a in kv.transact_sync(lambda tr: cluster.live_agents(tr, SUB, now))]


def test_an_agent_is_live_until_its_lease_runs_out(kv):
    register(kv, 9092)
    register(kv, 9093, expires=NOW + 1_000)
    assert live_ports(kv) == [9092, 9093]
    assert live_ports(kv, now=NOW + 1_000) == [9092]
    assert live_ports(kv, now=NOW + LEASE) == []


def test_deregistering_an_address_drops_that_agent_at_once(kv):
    first, second = register(kv, 9092), register(kv, 9093)
    gone = kv.transact_sync(lambda tr: cluster.deregister_address(tr, SUB, "127.0.0.1", 9093))
    assert gone == second
    assert live_ports(kv) == [9092]
    # Registered again (a restart on its port), it is back under the same node id.
    assert register(kv, 9093) == second
    assert live_ports(kv) == [9092, 9093]
    assert register(kv, 9092) == first


def test_deregistering_an_address_no_agent_ever_had_changes_nothing(kv):
    register(kv, 9092)
    other_host = kv.transact_sync(
        lambda tr: cluster.deregister_address(tr, SUB, "other-host", 9092)
    )
    never = kv.transact_sync(lambda tr: cluster.deregister_address(tr, SUB, "127.0.0.1", 9094))
    assert (other_host, never) == (None, None)
    assert live_ports(kv) == [9092]


def test_agent_records_carry_listeners_and_old_ones_are_plaintext(kv):
    listeners = (("PLAINTEXT", "10.0.0.1", 9092), ("SASL_SSL", "broker.example", 9094))
    kv.transact_sync(
        lambda tr: cluster.register_agent(tr, SUB, "10.0.0.1", 9092, None, 10_000, listeners)
    )
    # A record written before listeners existed: host, port, rack, lease only.
    kv.transact_sync(
        lambda tr: tr.set(SUB.key(keys.AGENT, 7), keys.pack_value(("10.0.0.2", 9092, None, 10_000)))
    )
    new, old = kv.transact_sync(lambda tr: cluster.live_agents(tr, SUB, 0))
    assert new.endpoint("SASL_SSL") == ("broker.example", 9094)
    assert new.endpoint("PLAINTEXT") == ("10.0.0.1", 9092)
    assert new.endpoint("SSL") is None
    assert old.endpoint("PLAINTEXT") == ("10.0.0.2", 9092)
    assert old.endpoint("SASL_SSL") is None
