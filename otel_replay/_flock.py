"""Exclusive ``flock`` locks taken without waiting: who holds a writer's lock file, and taking it.

Lock files are never replaced or rewritten by whoever locks them, so every process that locks one path locks one
inode; closing the descriptor drops the lock. Descriptors are not inherited by child processes (``os.open`` makes
them non-inheritable), so a spawned program never keeps a lock alive after its parent died.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

__all__ = ["held_elsewhere", "try_lock"]


def try_lock(path: str | os.PathLike[str], *, create: bool = True) -> int | None:
    """Open ``path`` (created when ``create``) and take its exclusive lock without waiting.

    Returns the descriptor (close it to release the lock), or ``None`` when another descriptor holds the lock. Raises
    ``OSError`` when the file cannot be opened or locked for another reason (the descriptor is closed first).
    """
    flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    fd = os.open(path, flags, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def held_elsewhere(path: str | os.PathLike[str]) -> bool:
    """Whether some live descriptor holds the lock on ``path``; a missing or unreadable file counts as not held.

    A probe: the lock is taken and dropped at once when free, and the file is never created.
    """
    try:
        fd = os.open(Path(path), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # closing drops a lock taken here
    return False
