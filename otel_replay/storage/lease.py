"""A per-partition lease: an exclusive ``flock`` so two compactors never rewrite one partition at once.

The lock files live in ``<dataset>/.locks/`` (outside ``spans/``, so dropping
a partition never removes a lock another process holds). The kernel releases
a ``flock`` when its holder exits, crashed or not, so a lease is never left
stuck. Local filesystems only: object stores need a conditional-put lease.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from types import TracebackType

from otel_replay.errors import DatasetError

__all__ = ["PartitionLease"]


class PartitionLease:
    """Exclusive lease on partition ``name`` (e.g. ``date=2026-01-31``) of ``dataset``.

    ``acquire(wait=0)`` returns ``False`` at once when another process holds
    it; ``wait`` seconds keeps trying. Use as a context manager after a
    successful ``acquire``, or call :meth:`release`.
    """

    def __init__(self, dataset: str | os.PathLike[str], name: str) -> None:
        """Prepare (not take) the lease; see the class docstring."""
        if "/" in name or name.startswith("."):
            raise DatasetError(f"bad partition name {name!r} for a lease")
        self.path = Path(dataset) / ".locks" / f"{name}.lock"
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lease."""
        return self._fd is not None

    def acquire(self, wait: float = 0.0) -> bool:
        """Take the lease; ``False`` when another holder kept it for ``wait`` seconds."""
        if self._fd is not None:
            return True
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise DatasetError(f"cannot open the lease file {self.path}: {exc.strerror or exc}") from exc
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return False
                time.sleep(0.05)
                continue
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            self._fd = fd
            return True

    def release(self) -> None:
        """Give the lease back (no-op when not held)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> PartitionLease:
        if not self.acquire():
            raise DatasetError(f"partition lease {self.path} is held by another process")
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()
