"""Every ``OTEL_REPLAY_*`` environment variable, defined once and read through one checker.

Keyword arguments always win; these variables are the fallback, then the
documented default. A malformed value is a :class:`~otel_replay.errors.ConfigError`
naming the variable and what it must be, raised where the setting is read
(at construction), never at first use.

================================  ==========================================  ===============
variable                          meaning                                     default
================================  ==========================================  ===============
``OTEL_REPLAY_DATASET``           dataset directory                           ``./traces``
``OTEL_REPLAY_SIGNING_KEY``       record signing secret (16+ characters)      -
``OTEL_REPLAY_KEY_FILE``          file holding the signing secret             -
``OTEL_REPLAY_MAX_FILE_ROWS``     exporter: roll a file at this many rows     200000
``OTEL_REPLAY_MAX_FILE_BYTES``    exporter: roll a file at this many bytes    134217728
``OTEL_REPLAY_MAX_FILE_AGE``      exporter: roll buffered rows this old (s)   5
``OTEL_REPLAY_COMPACT_EVERY``     exporter: compact past days every N s       off
``OTEL_REPLAY_DEBUG``             CLI: show tracebacks of unexpected errors   off
``OTEL_REPLAY_SERVE_GRPC``        ``serve``: gRPC ``HOST:PORT`` or ``off``    127.0.0.1:4317
``OTEL_REPLAY_SERVE_HTTP``        ``serve``: HTTP ``HOST:PORT`` or ``off``    127.0.0.1:4318
``OTEL_REPLAY_INGEST_MAX_LINE``   ``ingest``: largest line/record (bytes)    33554432
``OTEL_REPLAY_INGEST_MAX_RATIO``  ``ingest``: largest decompression ratio    1000
``OTEL_REPLAY_RECORD_SESSION``    record the whole process as this session    -
``OTEL_REPLAY_RERUN_MAX_BODY``    recording: largest HTTP body kept (bytes)   8388608
``OTEL_REPLAY_REDACT_NAMES``      more secret names, comma-separated          -
``OTEL_REPLAY_REDACT_PATTERNS``   more secret regexes, one per line           -
``OTEL_REPLAY_OUTCOME_SYNC``      outcome durable against ``process`` crash   ``process``
                                  or ``machine`` crash on return
================================  ==========================================  ===============

``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` (the OpenTelemetry GenAI
instrumentations' own switch; only a yes or ``SPAN_ONLY`` / ``SPAN_AND_EVENT`` counts, see
:func:`otel_replay.instrumentation._common.content_enabled`) turns on prompt,
completion and tool-argument capture in :mod:`otel_replay.instrumentation`.

``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` are the OpenTelemetry
SDK's own and are resolved by ``Resource.create``.
"""

from __future__ import annotations

import decimal
import math
import numbers
import os
import re
from typing import Any, Final

from otel_replay.errors import ConfigError

__all__ = [
    "BSP_MAX_QUEUE_SIZE",
    "CAPTURE_QUEUE_SIZE",
    "CAPTURE_MESSAGE_CONTENT",
    "COMPACT_EVERY",
    "DATASET",
    "DEBUG",
    "INGEST_MAX_LINE",
    "INGEST_MAX_RATIO",
    "KEY_FILE",
    "MAX_FILE_AGE",
    "MAX_FILE_BYTES",
    "MAX_FILE_ROWS",
    "MAX_WAIT_SECONDS",
    "OUTCOME_SYNC",
    "RECORD_SESSION",
    "REDACT_NAMES",
    "REDACT_PATTERNS",
    "RERUN_MAX_BODY",
    "SERVE_GRPC",
    "SERVE_HTTP",
    "SIGNING_KEY",
    "absolute_dataset",
    "check_number",
    "dataset_dir",
    "env_flag",
    "env_number",
    "env_text",
]

DATASET: Final = "OTEL_REPLAY_DATASET"
SIGNING_KEY: Final = "OTEL_REPLAY_SIGNING_KEY"
KEY_FILE: Final = "OTEL_REPLAY_KEY_FILE"
MAX_FILE_ROWS: Final = "OTEL_REPLAY_MAX_FILE_ROWS"
MAX_FILE_BYTES: Final = "OTEL_REPLAY_MAX_FILE_BYTES"
MAX_FILE_AGE: Final = "OTEL_REPLAY_MAX_FILE_AGE"
COMPACT_EVERY: Final = "OTEL_REPLAY_COMPACT_EVERY"
"""Exporter: compact the partitions of past days every N seconds on a background thread (unset: off)."""
DEBUG: Final = "OTEL_REPLAY_DEBUG"
SERVE_GRPC: Final = "OTEL_REPLAY_SERVE_GRPC"
SERVE_HTTP: Final = "OTEL_REPLAY_SERVE_HTTP"
RECORD_SESSION: Final = "OTEL_REPLAY_RECORD_SESSION"
"""Record the whole process as this rerun session (under ``opentelemetry-instrument``); ``auto`` picks a new id."""
RERUN_MAX_BODY: Final = "OTEL_REPLAY_RERUN_MAX_BODY"
"""Recording: cap on one recorded HTTP response body, in bytes (default 8 MiB); a capped body is marked."""
REDACT_NAMES: Final = "OTEL_REPLAY_REDACT_NAMES"
"""More names whose values are redacted everywhere, comma-separated (:func:`otel_replay.redaction.is_secret_name`)."""
REDACT_PATTERNS: Final = "OTEL_REPLAY_REDACT_PATTERNS"
"""More regular expressions whose matches are redacted everywhere, one per line (:mod:`otel_replay.redaction`)."""
OUTCOME_SYNC: Final = "OTEL_REPLAY_OUTCOME_SYNC"
"""``record_outcome()`` returns once the outcome survives a ``process`` crash (default) or a ``machine`` crash."""
INGEST_MAX_LINE: Final = "OTEL_REPLAY_INGEST_MAX_LINE"
INGEST_MAX_RATIO: Final = "OTEL_REPLAY_INGEST_MAX_RATIO"
CAPTURE_MESSAGE_CONTENT: Final = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
"""The OpenTelemetry GenAI instrumentations' switch: record prompts, completions and tool arguments."""
BSP_MAX_QUEUE_SIZE: Final = "OTEL_BSP_MAX_QUEUE_SIZE"
"""The SDK's own batch-queue size, checked by ``configure()`` (a whole number, at least the export batch size);
when unset, ``configure()`` uses :data:`CAPTURE_QUEUE_SIZE`."""
CAPTURE_QUEUE_SIZE: Final = 65_536
"""``configure()``'s span queue (the SDK default, 2,048, overflows while a large Parquet file is written)."""

DEFAULT_DATASET: Final = "./traces"
MAX_WAIT_SECONDS: Final = 10_000_000.0
"""Longest interval or timeout accepted (about 115 days): the OS's timers overflow near 1e10 s."""


def env_text(name: str, default: str | None = None) -> str | None:
    """The variable's text, or ``default`` when unset or empty."""
    raw = os.environ.get(name)
    return default if raw is None or raw.strip() == "" else raw


def env_number(
    name: str,
    default: float,
    *,
    minimum: float = 0.0,
    maximum: float | None = None,
    integer: bool = False,
    inclusive: bool = False,
) -> float:
    """The variable as a finite number above ``minimum`` (and at most ``maximum``), or ``default`` when unset.

    ``inclusive``: ``minimum`` itself is allowed too (``0`` meaning "off").

    Raises:
        ConfigError: the text is not a number, not finite, not above ``minimum``
            (below it, when ``inclusive``), above ``maximum``, or not whole where
            ``integer`` is asked for.

    """
    raw = env_text(name)
    if raw is None:
        return default
    try:
        if not raw.isascii():  # float() reads '١٢' and '１２' as 12: a value nobody can check by eye
            raise ValueError(raw)
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if inclusive and value == minimum:
        return value
    return _bounded(f"{name}={raw!r}", value, minimum, maximum, integer)


def check_number(
    name: str, value: Any, *, minimum: float = 0.0, maximum: float | None = None, integer: bool = False
) -> float:
    """An argument given from Python, checked as :func:`env_number` checks a variable: ``value`` as a float.

    Raises:
        ConfigError: ``name`` and the value, when it is not a number (a bool
            is not), not finite, not above ``minimum``, above ``maximum``, or
            not whole where ``integer`` is asked for.

    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        shown = f"{name}=<an int of {value.bit_length()} bits>"  # repr() of a long enough int raises
    else:
        shown = f"{name}={value!r}"[:120]
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, decimal.Decimal)):
        raise ConfigError(f"{shown} is not a number")
    try:
        number = float(value)
    except (OverflowError, ValueError, decimal.InvalidOperation):  # past a float's range
        too_large = f"{shown} must be at most {maximum:g}" if maximum is not None else f"{shown} is too large"
        raise ConfigError(too_large) from None
    return _bounded(shown, number, minimum, maximum, integer)


_LARGEST_WHOLE = float(2**53)
"""Past it a float no longer holds every whole number: a count read as a float is refused above it."""


def _bounded(shown: str, value: float, minimum: float, maximum: float | None, integer: bool) -> float:
    if not math.isfinite(value) or value <= minimum:
        raise ConfigError(f"{shown} must be a finite number above {minimum:g}")
    if integer and (maximum is None or maximum > _LARGEST_WHOLE):
        maximum = _LARGEST_WHOLE
    if maximum is not None and value > maximum:
        raise ConfigError(f"{shown} must be at most {maximum:g}")
    if integer and not value.is_integer():
        raise ConfigError(f"{shown} must be a whole number")
    return value


def env_flag(name: str) -> bool:
    """True when the variable is set to anything but empty, ``0``, ``false``, ``no`` or ``off``."""
    raw = env_text(name)
    return raw is not None and raw.strip().lower() not in ("0", "false", "no", "off")


_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def absolute_dataset(dataset: str) -> str:
    """A local dataset path made absolute against the current directory; a URI (``s3://``, ``file://``) as given.

    A writer resolves its dataset once: a relative path kept as given would
    follow later ``chdir`` calls and split one process's records over two datasets.
    """
    return dataset if _URI.match(dataset) else os.path.abspath(dataset)


def dataset_dir(explicit: str | os.PathLike[str] | None = None) -> str:
    """The dataset directory: ``explicit``, else ``OTEL_REPLAY_DATASET``, else ``./traces``.

    Raises:
        ConfigError: ``explicit`` is not a path (an int, bytes) or is blank:
            ``os.path.abspath('')`` is the current directory, which would take
            the records instead of an error.

    """
    if explicit is not None:
        path = os.fspath(explicit) if isinstance(explicit, (str, os.PathLike)) else None
        if not isinstance(path, str):
            raise ConfigError(f"dataset={explicit!r}"[:120] + " must be a path (str or os.PathLike of str)")
        if path.strip() == "":
            raise ConfigError(f"dataset={path!r} is blank: give a directory or s3://bucket/prefix")
        return path
    return env_text(DATASET, DEFAULT_DATASET) or DEFAULT_DATASET
