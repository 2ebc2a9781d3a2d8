"""What an agent's processes load: `python -m broker` (and the `bucketlog` command) leave
hypothesis out, which kio would otherwise import for test strategies it never needs
there; so do compaction's worker processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from broker.workers import StoreSpec, WorkerPool

pytestmark = pytest.mark.slow


def _loaded(store: object, names: str) -> dict[str, bool]:
    """In a worker: import kio's types, then say which modules are loaded for real."""
    import kio.static.primitive  # noqa: F401  (what a job's record code imports)

    return {name: sys.modules.get(name) is not None for name in names.split(",")}


def test_the_agent_entry_imports_kio_without_hypothesis() -> None:
    pytest.importorskip("hypothesis")  # installed here: the entry must keep it out
    probe = (
        "import sys, broker.__main__; "
        "print(sys.modules.get('hypothesis') is not None, 'kio' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["False", "True"]
    # The same import without the entry loads hypothesis: the check above can fail.
    plain = "import sys, broker.cli; print(sys.modules.get('hypothesis') is not None)"
    out = subprocess.run(
        [sys.executable, "-c", plain], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["True"]


async def test_a_compaction_worker_imports_kio_without_hypothesis(tmp_path: Path) -> None:
    pytest.importorskip("hypothesis")
    pool = WorkerPool(StoreSpec(f"file://{tmp_path / 'objects'}"), workers=1, nice=0)
    try:
        loaded, _spent = await pool.run(_loaded, "kio,hypothesis")
    finally:
        pool.close()
    assert loaded == {"kio": True, "hypothesis": False}
