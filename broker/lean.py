"""Modules an agent process never needs, kept out of it."""

from __future__ import annotations

import sys

# Imported by kio only to register test strategies for its types, when installed.
TEST_ONLY = ("hypothesis",)


def leave_out_test_only_modules() -> None:
    """Make `import hypothesis` fail in this process (a None in sys.modules), unless it
    is imported already. Only for processes that are an agent or its worker."""
    for name in TEST_ONLY:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]
