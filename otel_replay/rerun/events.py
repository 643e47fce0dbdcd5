"""Recorded events, the boundary call our wrappers hand to the seam, and the causal fingerprint."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import baggage

from otel_replay import semconv as sc
from otel_replay._seam import Call
from otel_replay.records import DecisionRecord
from otel_replay.rerun.codec import arguments_hash, decoded_json_text, stable_json

__all__ = [
    "FINGERPRINT_VERSION",
    "UNORDERED",
    "BoundaryCall",
    "Event",
    "Fingerprint",
    "decision_arguments",
    "describe_event",
    "is_ordered",
    "scope_of",
    "stream_key",
    "value_hash",
]

_frame = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_text = json.encoder.encode_basestring
"""A JSON string as :data:`_frame` writes one (``ensure_ascii=False``)."""


def _step_frame(boundary: str, name: str, args_hash: str, value_hash: str, after: Any, ordered: bool) -> str:
    """``_frame([boundary, name, args_hash, value_hash] + ([after] if ordered else []))``, written directly.

    The same text (each string as the encoder writes it, an int as its decimal form, ``None`` as ``null``)
    without building an encoder for each of a rerun's steps; parts of another type go through :data:`_frame`.
    """
    if not (
        boundary.__class__ is str
        and name.__class__ is str
        and args_hash.__class__ is str
        and value_hash.__class__ is str
        and (after is None or after.__class__ is int)
    ):
        parts: list[Any] = [boundary, name, args_hash, value_hash]
        return _frame([*parts, after] if ordered else parts)
    head = f"[{_text(boundary)},{_text(name)},{_text(args_hash)},{_text(value_hash)}"
    if not ordered:
        return head + "]"
    return f"{head},{'null' if after is None else int.__repr__(after)}]"


@dataclass(frozen=True)
class BoundaryCall(Call):
    """A :class:`Call` from one of the rerun package's own wrappers.

    ``invoke`` for such a call returns an encoded (plain JSON) value, which
    the record mode stores and the rerun mode serves back without invoking.
    """

    stream: str = ""
    """Which recorded stream serves this call (boundary, name, consumer, correlation id)."""
    arguments_text: str = ""
    """The canonical JSON of the arguments as stored (and shown); hashed to match steps unless ``match_text``."""
    is_async: bool = False
    """``invoke`` returns an awaitable."""
    record_as: Callable[[Any], Any] | None = field(default=None, compare=False)
    """Turns what ``invoke`` returned into what is stored (redacted, capped); the live value goes to the
    agent unchanged, so recording never changes what the program sees. ``None``: stored as returned."""
    match_text: str = field(default="", repr=False)
    """What the call is matched on when it is not the stored text: the unredacted canonical form (an HTTP
    request's method, full URL, headers and body digest). Only its keyed hash is ever stored."""
    later: Callable[[], tuple[str, str]] | None = field(default=None, compare=False, repr=False)
    """For a call whose arguments are complete only once it ran (a request body streamed to the server while
    it is recorded): returns ``(arguments_text, match_text)``, read after ``invoke``."""
    shown: Callable[[], str] | None = field(default=None, compare=False, repr=False)
    """Builds the stored text when it is first needed, in place of ``arguments_text`` (an HTTP request's
    redacted text and part digests: a recording stores it, a rerun reads it only to show a divergence, so a
    call that matches never builds it). Matching never reads it: ``match_text`` is given at once."""

    def stored_arguments(self) -> str:
        """The arguments text to store and show (for a ``later`` call: once ``invoke`` ran; built once)."""
        if self.later is not None:
            return self.later()[0]
        if self.shown is None:
            return self.arguments_text
        cached = self.__dict__.get("_shown_text")
        if cached is None:
            cached = self.shown()
            object.__setattr__(self, "_shown_text", cached)
        return cached

    @property
    def args_hash(self) -> str:
        """The hash matched against the recorded step (computed once per call; a ``later`` call's after it ran)."""
        cached = self.__dict__.get("_args_hash")
        if cached is None:
            text = self.later()[1] if self.later is not None else self.match_text or self.arguments_text
            cached = arguments_hash(self.boundary, self.name, text)
            object.__setattr__(self, "_args_hash", cached)
        return cached


def stream_key(boundary: str, name: str, who: str = "") -> str:
    """The stream a call belongs to: per consumer and per correlation id in scope (so threads keep their own)."""
    corr = baggage.get_baggage(sc.BAGGAGE_CORRELATION_ID)
    return f"{boundary}|{name}|{who}|{corr or ''}"


@dataclass
class Event:
    """One recorded boundary crossing."""

    seq: int
    boundary: str
    name: str
    stream: str
    arguments: str
    args_hash: str
    value: Any = None
    error: Mapping[str, str] | None = None
    transparent: bool = False
    trace_id: str = ""
    span_id: str = ""
    thread: str = ""
    ref: str = ""
    """The original record id of a decision event (volatile: not fingerprinted)."""
    after: int | None = None
    """An ordered call of a format-3 recording: how many ordered calls of its correlation scope had completed
    when it started (those came before it; ones that overlapped it did not). ``None`` for the rest."""
    decoded: bool = field(default=False, repr=False, compare=False)
    """``value`` and ``error`` were decoded from JSON text (a loaded recording's): exact JSON types only, which
    :meth:`value_hash` hashes in one pass of the C encoder."""

    def to_json(self) -> dict[str, Any]:
        """The stored form (short keys: a recording holds thousands)."""
        out: dict[str, Any] = {
            "q": self.seq,
            "b": self.boundary,
            "n": self.name,
            "s": self.stream,
            "a": self.arguments,
            "h": self.args_hash,
            "v": self.value,
        }
        if self.error is not None:
            out["e"] = dict(self.error)
        if self.transparent:
            out["t"] = True
        if self.trace_id:
            out["ti"], out["si"] = self.trace_id, self.span_id
        if self.thread:
            out["th"] = self.thread
        if self.ref:
            out["r"] = self.ref
        if self.after is not None:
            out["o"] = self.after
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, decoded: bool = False) -> Event:
        """Inverse of :meth:`to_json`; ``KeyError``/``TypeError`` on a malformed event.

        ``decoded``: ``data`` was just parsed from JSON text (``json.loads``), so its values hold the exact
        JSON types only (see :attr:`decoded`).
        """
        error = data.get("e")
        after = data.get("o")
        return cls(
            seq=int(data["q"]),
            boundary=str(data["b"]),
            name=str(data["n"]),
            stream=str(data["s"]),
            arguments=str(data["a"]),
            args_hash=str(data["h"]),
            value=data.get("v"),
            error=dict(error) if isinstance(error, dict) else None,
            transparent=bool(data.get("t", False)),
            trace_id=str(data.get("ti", "")),
            span_id=str(data.get("si", "")),
            thread=str(data.get("th", "")),
            ref=str(data.get("r", "")),
            after=None if after is None else int(after),
            decoded=decoded,
        )

    def value_hash(self) -> str:
        """Hash of what the call returned (or raised), computed once."""
        cached = self.__dict__.get("_value_hash")
        if cached is None:
            text = decoded_json_text([self.value, self.error]) if self.decoded else None
            cached = _text_hash(text) if text is not None else value_hash(self.value, self.error)
            self.__dict__["_value_hash"] = cached
        return cached


def value_hash(value: Any, error: Any = None) -> str:
    """Hash of a returned value (or raised error) as it is folded into the fingerprint."""
    return _text_hash(stable_json([value, error]))


def _text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def decision_arguments(record: DecisionRecord) -> str:
    """What of a decision is compared between runs: type, action, the state it relied on, its inputs."""
    return stable_json(
        {
            "decision_type": record.decision_type,
            "action": record.action.to_json() if record.action is not None else None,
            "state": record.snapshot.state if record.snapshot is not None else None,
            "inputs": record.inputs,
            "error": record.error,
        }
    )


def describe_event(boundary: str, name: str, arguments: str, limit: int = 160) -> str:
    """A one-line, human description of a call: ``http GET http://host/path body=...``."""
    text = f"{boundary} {name}"
    if arguments not in ("", "{}", "null"):
        text += f" {arguments}"
    return text if len(text) <= limit else text[: limit - 1] + "…"


FINGERPRINT_VERSION = 3
"""How the fingerprint folds a run. 3 (format-3 recordings) adds to version 2 the place of each ordered call
(:func:`is_ordered`) in its correlation scope's order. 2 keeps one running SHA-256 and a count per stream
(bounded memory) and no order across streams. 1 (recordings made before 2026-11-26) kept every step's framed
text until the end. A rerun compares a recording by the version of its own format (see
:func:`otel_replay.rerun.load.load_recording`)."""

UNORDERED = frozenset({"clock", "entropy"})
"""Boundaries whose calls are served and compared per consumer only, not in order with the rest: a clock read
or a random draw changes nothing outside the process, and reads made by helpers, loggers and libraries move
around freely between two runs of the same agent."""


def is_ordered(boundary: str) -> bool:
    """A call whose place among its scope's ordered calls is part of the run: tools, HTTP, decisions, acts, verdicts."""
    return boundary not in UNORDERED


def scope_of(stream: str, boundary: str, name: str) -> str:
    """The correlation scope of a stream key (``boundary|name|consumer|correlation id``): its last part.

    Parsed from the known boundary and name, so a ``|`` in a name does not move it; a consumer is a
    function's qualified name, which holds no ``|``.
    """
    prefix = f"{boundary}|{name}|"
    if stream.startswith(prefix):
        return stream[len(prefix) :].partition("|")[2]
    return stream.rpartition("|")[2]


@dataclass
class Fingerprint:
    """The causal fingerprint: SHA-256 over each stream's (kind, name, arguments, value, order) sequence.

    Streams are ordered by key and events within a stream by call order, so
    the fingerprint is independent of every volatile field (timestamps, span
    and trace ids, host paths, durations). Parts are framed as JSON arrays,
    like the record hash. Version 3 (the default) also folds, with each
    ordered call (:func:`is_ordered`), how many ordered calls of its
    correlation scope came before it (:attr:`Event.after`): a tool called
    before another, or an HTTP request sent before a decision, gives another
    fingerprint, while calls that overlapped (``asyncio.gather``) and calls in
    two scopes (threads each in their own :func:`otel_replay.correlation`)
    may interleave either way. Version 2 hashes the streams only (no order
    across them); ``version=1`` is the older form, kept to check fingerprints
    stored by recordings made before it.
    """

    version: int = FINGERPRINT_VERSION
    _streams: dict[str, Any] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(
        self, stream: str, boundary: str, name: str, args_hash: str, value_hash: str, after: int | None = None
    ) -> None:
        """Fold one step into its stream (``after``: its place in its scope's order, version 3 only)."""
        ordered = self.version >= 3 and boundary not in UNORDERED
        part = _step_frame(boundary, name, args_hash, value_hash, after, ordered).encode()
        with self._lock:
            entry = self._streams.get(stream)
            if self.version == 1:
                self._streams.setdefault(stream, []).append(part)
                return
            if entry is None:
                entry = self._streams[stream] = [hashlib.sha256(), 0]
            entry[0].update(part + b"\n")
            entry[1] += 1

    def add_event(self, event: Event) -> None:
        """Fold one recorded event."""
        self.add(event.stream, event.boundary, event.name, event.args_hash, event.value_hash(), event.after)

    def hexdigest(self) -> str:
        """The fingerprint."""
        with self._lock:
            if self.version == 1:
                digest = hashlib.sha256(b"otel-replay causal fingerprint v1\n")
                for stream in sorted(self._streams):
                    digest.update(_frame([stream, len(self._streams[stream])]).encode())
                    for part in self._streams[stream]:
                        digest.update(part)
                        digest.update(b"\n")
                return digest.hexdigest()
            digest = hashlib.sha256(f"otel-replay causal fingerprint v{min(self.version, 3)}\n".encode())
            for stream in sorted(self._streams):
                running, count = self._streams[stream]
                digest.update(_frame([stream, count, running.hexdigest()]).encode())
                digest.update(b"\n")
            return digest.hexdigest()

    @classmethod
    def of(cls, events: Iterable[Event], version: int = FINGERPRINT_VERSION) -> Fingerprint:
        """The fingerprint of a recorded event sequence."""
        fp = cls(version=version)
        for event in events:
            if not event.transparent:
                fp.add_event(event)
        return fp
