"""What taking a snapshot reports as it goes: the progress callback's shape and the counters of one take."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

#: ``progress(stage, done, total)``: stage is "manifest", "transfer" or "done"; byte counts for "transfer".
Progress = Callable[[str, int, int], None]


@dataclass
class SnapshotStats:
    files: int = 0
    bytes: int = 0
    blobs_needed: int = 0
    blobs_transferred: int = 0
    bytes_transferred: int = 0
    seconds: float = 0.0
    manifest_seconds: float = 0.0
    transfer_seconds: float = 0.0
    host_hashed: int = 0
    wire: str = ""  # "tar" or "tar+zstd"
    wire_bytes: int = 0
