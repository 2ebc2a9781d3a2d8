"""The group coordinator: classic consumer groups, their timers and their durable state."""

from broker.groups.coordinator import GroupCoordinator
from broker.groups.settings import GroupSettings

__all__ = ["GroupCoordinator", "GroupSettings"]
