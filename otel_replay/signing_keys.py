"""Signing keys: the HMAC secret records are signed with, and where it comes from.

Key resolution (first match wins):

1. an explicit ``key`` / ``key_file`` argument;
2. ``OTEL_REPLAY_SIGNING_KEY`` - the secret itself (any text, 16+ characters);
3. ``OTEL_REPLAY_KEY_FILE`` - a file holding the secret;
4. ``~/.config/otel-replay/signing.key`` - created (mode 0600, 32 random bytes,
   hex) the first time something is signed.

Re-exported by :mod:`otel_replay.integrity`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import os
import secrets
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_replay import settings
from otel_replay.errors import ConfigError

__all__ = ["DEFAULT_KEY_FILE", "SigningKey", "load_signing_key"]

DEFAULT_KEY_FILE = Path("~/.config/otel-replay/signing.key")
"""Where the signing key is kept (and created) when neither an argument nor the environment names one."""



@dataclass(frozen=True)
class SigningKey:
    """An HMAC secret and its public id (the first 16 hex of its SHA-256)."""

    secret: bytes = field(repr=False)

    @functools.cached_property
    def key_id(self) -> str:
        """A short, non-secret id stamped on every record signed with this key."""
        return hashlib.sha256(self.secret).hexdigest()[:16]

    @functools.cached_property
    def _keyed(self) -> Any:
        # The key schedule done once; each signature copies it (half the cost of hmac.digest).
        keyed = hmac.new(self.secret, digestmod=hashlib.sha256)
        # OpenSSL's own HMAC object when hmac wraps one: copying it skips the Python wrapper (same bytes).
        return getattr(keyed, "_hmac", None) or keyed

    def sign(self, digest: str) -> str:
        """HMAC-SHA256 of a record hash, hex."""
        mac = self._keyed.copy()
        mac.update(digest.encode())
        return mac.hexdigest()

    def check(self, digest: str, signature: str) -> bool:
        """Constant-time check of a signature."""
        return hmac.compare_digest(self.sign(digest), signature)


def load_signing_key(
    key: str | bytes | None = None, key_file: str | os.PathLike[str] | None = None, *, create: bool = True
) -> SigningKey | None:
    """Resolve the signing key (see the module docstring for the order).

    With ``create=False`` a missing default key file yields ``None`` instead
    of a new key (``verify`` uses this: it must not invent a key).
    """
    from_env = key is None and key_file is None
    if from_env:
        key = settings.env_text(settings.SIGNING_KEY)
        key_file = settings.env_text(settings.KEY_FILE)
    if key is not None:
        named = settings.SIGNING_KEY if from_env else "the signing_key argument"
        try:
            secret = key.encode() if isinstance(key, str) else key
        except UnicodeEncodeError:  # bytes that are not UTF-8 in the environment arrive as lone surrogates
            raise ConfigError(f"signing key is not valid UTF-8 text ({named}): use printable characters") from None
        if len(secret) < 16:
            raise ConfigError("signing key is too short: use at least 16 characters (OTEL_REPLAY_SIGNING_KEY)")
        return SigningKey(secret)
    path = Path(key_file).expanduser() if key_file is not None else DEFAULT_KEY_FILE.expanduser()
    if path.exists():
        return _key_from_file(path)
    if key_file is not None:
        named = f" ({settings.KEY_FILE})" if from_env else ""
        raise ConfigError(f"signing key file {path} does not exist{named}")
    if not create:
        return None
    return _create_key_file(path)


def _key_from_file(path: Path) -> SigningKey:
    """The key stored in ``path`` (one line, 16 bytes to 4 KiB)."""
    if not (path.is_file() or path.is_fifo()):  # a directory or a device (/dev/zero never ends)
        raise ConfigError(f"signing key file {path} is not a regular file")
    with path.open("rb") as handle:
        secret = handle.read(4097)  # a key is a few dozen bytes; 4 KiB bounds the read
    if len(secret) > 4096:
        raise ConfigError(f"signing key file {path} is larger than 4 KiB: not a key file")
    secret = secret.strip()
    if len(secret) < 16:
        raise ConfigError(f"signing key file {path} holds fewer than 16 bytes")
    return SigningKey(secret)


def _create_key_file(path: Path) -> SigningKey:
    """Create the default key file at ``path``, or use the one another process created first.

    Processes that start together on a fresh machine (a forked worker pool)
    all find no key: each writes its key to a temporary file beside ``path``
    and hard-links it into place, so the file appears whole or not at all and
    exactly one process's key wins; the others read the winner's (never a
    half-written file, never a second key).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_hex(32).encode()
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(secret)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(temp, path)  # never replaces a key another process linked first
        except FileExistsError:
            return _key_from_file(path)
        except OSError:  # a filesystem without hard links: exclusive create, then write (readers wait for it)
            return _create_exclusive(path, secret)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temp)
    _fsync_dir(path.parent)  # records are signed with this key from now on: it must survive a crash
    return SigningKey(secret)


def _create_exclusive(path: Path, secret: bytes) -> SigningKey:
    """:func:`_create_key_file` where hard links fail: ``O_EXCL``; a loser waits up to 2 s for the key to be written."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        deadline = time.monotonic() + 2.0
        while True:
            try:
                return _key_from_file(path)
            except ConfigError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
    with os.fdopen(fd, "wb") as handle:
        handle.write(secret)
        handle.flush()
        os.fsync(handle.fileno())
    return SigningKey(secret)


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not every platform opens directories
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
