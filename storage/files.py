"""What the local store and its segment files share about files in a folder."""

from __future__ import annotations

import os

# The name of a file being written: list() never shows one, and one left by a crashed
# writer is swept when stale (storage.local's remove_stale_temp_files).
TEMP_PREFIX = ".tmp."


def fsync_dir(folder: str) -> None:
    """Make the folder's entries durable (a file created, renamed or linked in it)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
