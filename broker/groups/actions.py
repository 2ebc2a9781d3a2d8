"""What the group state machines ask of their shells, beside their own protocol's actions:
the actions of both `classic_machine` and `consumer_machine`.

A shell runs a transition's actions in order and stops at the first that fails; `Respond`
comes last, if at all. A timeout is named by a key of strings that begins with its group
id, so that `CancelTimeouts` finds all of a group's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

S = TypeVar("S")  # the group's stored form
T = TypeVar("T")  # the machine's timeout events
A = TypeVar("A")  # the answer to the request being handled

TimeoutKey = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Persist(Generic[S]):
    """Write this stored form of the group, fenced by the revision the shell last saw."""

    group: S


@dataclass(frozen=True, slots=True)
class ScheduleTimeout(Generic[T]):
    """Hand `timeout` back to the machine after delay_ms, replacing any with its key."""

    timeout: T
    delay_ms: int


@dataclass(frozen=True, slots=True)
class CancelTimeout:
    key: TimeoutKey


@dataclass(frozen=True, slots=True)
class CancelTimeouts:
    """Cancel every timeout of the group."""


@dataclass(frozen=True, slots=True)
class Respond(Generic[A]):
    """Answer the request being handled."""

    answer: A
