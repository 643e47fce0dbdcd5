"""Record mode: every boundary crossing of the agent becomes an event, stored as sealed chunk spans.

Events are numbered per session in the order their calls completed, carry
the trace and span id that was current (so a value is attributed to the
right span, across threads and asyncio tasks) and are written in chunks of
at most :data:`CHUNK_EVENTS` events (or :data:`CHUNK_BYTES` of text) as
``replay.recording`` record spans, each sealed into the process's hash chain
like every other record. The last chunk is marked final and carries the
session's causal fingerprint. A process killed mid-run leaves the chunks
already written; a rerun uses them and says the recording ended early.
"""

from __future__ import annotations

import inspect
import json
import logging
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar, TypeVar

from opentelemetry import trace

from otel_replay import semconv as sc
from otel_replay._json import canonical_json
from otel_replay._seam import Call
from otel_replay.capture.context import session as session_scope
from otel_replay.capture.recorder import get_recorder
from otel_replay.errors import ConfigError
from otel_replay.records import DecisionRecord, new_id
from otel_replay.redaction import message_of, redact
from otel_replay.rerun.callers import INSIDE
from otel_replay.rerun.codec import (
    RECORDING_FORMAT,
    arguments_hash,
    encode_result,
    match_key,
    output_hash,
    redact_json_text,
    stable_json,
    unmatchable,
)
from otel_replay.rerun.events import (
    BoundaryCall,
    Event,
    Fingerprint,
    decision_arguments,
    is_ordered,
    scope_of,
    stream_key,
)
from otel_replay.rerun.interceptor import Interceptor

__all__ = ["CHUNK_BYTES", "CHUNK_EVENTS", "RecordMode", "outcome_of", "recording"]

T = TypeVar("T")
_log = logging.getLogger("otel_replay.rerun")
CHUNK_EVENTS = 256
CHUNK_BYTES = 4 * 1024 * 1024


def error_of(exc: BaseException) -> dict[str, str]:
    """How a raised exception is stored: its type's import path and its message."""
    message = message_of(exc)  # a broken __str__ must not cost the event
    # A lone surrogate (a non-UTF-8 file name in the message) cannot be stored: escaped, visibly.
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    # Messages name URLs and values (requests' "Max retries exceeded with url: /v1?api_key=…"): redacted
    # as the call's arguments are; the rerun raises the redacted message.
    message = redact(message)
    return {"type": f"{type(exc).__module__}:{type(exc).__qualname__}", "message": message}


_OUTCOME_LIMIT = 2000
"""Characters of an outcome kept (and compared): the message of a huge error is cut, the same on both sides."""


def outcome_of(exc: BaseException) -> str:
    """How a run that raised ``exc`` ended, as stored and compared: ``raised <module>:<qualname>: <message>``.

    The class is named by its import path, so ``requests.exceptions:ConnectionError`` is not
    ``builtins:ConnectionError``; the message is redacted (as recorded messages are); a ``SystemExit``'s
    message is its exit status (``sys.exit(2)``: ``raised builtins:SystemExit: 2``).
    """
    kind = type(exc)
    if isinstance(exc, SystemExit):
        message = str(exc.code)
    else:
        message = message_of(exc)  # a broken __str__ still ends the run, named
    message = redact(message.encode("utf-8", "backslashreplace").decode("utf-8"))
    return f"raised {kind.__module__}:{kind.__qualname__}: {message}"[:_OUTCOME_LIMIT]


class RecordMode:
    """The seam mode of a recording: run every call for real and keep what it returned."""

    records: ClassVar[bool] = True
    """This mode runs calls and stores them (the HTTP boundary then hashes a streamed body on its way)."""

    def __init__(self, session_id: str) -> None:
        """Record the boundary calls of ``session_id``."""
        self.session_id = session_id
        self.arguments_key: bytes | None = match_key(get_recorder().chain.key.secret)
        """Argument hashes are keyed with this, derived from the key that seals the chunks (see codec.match_key)."""
        self.recording_id = str(new_id())
        """Stamped on every chunk: a chunk of another run under the same session id is refused, not spliced in."""
        self.fingerprint = Fingerprint()
        self._lock = threading.Lock()
        self._seq = 0
        self._chunk = 0
        self._pending: list[str] = []
        """Each pending event as its canonical JSON text."""
        self._pending_bytes = 0
        self._flush_events, self._flush_bytes = CHUNK_EVENTS, CHUNK_BYTES
        """Pending size at which a chunk is written: doubled after each failed write (see :meth:`_flush_failed`)."""
        self._flush_failures = 0
        self.events = 0
        self.dropped = 0
        self.chunks: list[str] = []
        self._output: str | None = None
        self._completed: dict[str, int] = {}
        """Per correlation scope, how many ordered calls have completed (been recorded) so far."""
        self._warned: set[tuple[str, str]] = set()
        self.finish_failed = False
        """The final chunk could not be written (logged): the stored recording ends early."""
        self._closed = False

    def set_output(self, value: Any) -> None:
        """What the recorded run returned: a rerun whose entrypoint returns another value does not match.

        Compared by value (the argument codec's hash; only the hash is stored). A value with no value
        representation makes every rerun of the recording a mismatch.
        """
        self._output = output_hash(value)

    # --- the seam -----------------------------------------------------------
    def around(self, call: Call, invoke: Callable[[], T]) -> T:
        """Run the call for real and record it (nested calls belong to their outer call)."""
        if INSIDE.get() or self._closed:
            return invoke()
        if isinstance(call, BoundaryCall):
            if call.is_async:
                return self._around_async(call, invoke)  # type: ignore[arg-type, return-value]
            return self._opaque(call, call.stream, call.arguments_text, invoke, encode=False)
        text = stable_json(dict(call.arguments))
        stream = stream_key(call.boundary, call.name)
        if call.boundary == "tool":
            self._warn_unmatchable(call.name, text)
            return self._opaque(call, stream, text, invoke, encode=True)
        # model calls (and other instrumented spans) are transparent: their HTTP underneath is recorded
        self._add(call.boundary, call.name, stream, text, None, None, None, transparent=True)
        return invoke()

    def _warn_unmatchable(self, name: str, text: str) -> None:
        """Said when recording, once per tool and type: a rerun can never match such a call."""
        what = unmatchable(text)
        if what is None or (name, what) in self._warned:
            return
        self._warned.add((name, what))
        _log.warning(
            "otel-replay recording %s: tool %s was called with %s, which has no value representation; "
            "a rerun cannot compare this call, so it will not match (pass a value type instead)",
            self.session_id,
            name,
            what,
        )

    def _after(self, boundary: str, name: str, stream: str) -> int | None:
        """At a call's start: how many ordered calls of its scope had completed (``None``: not an ordered call).

        A rerun must have made those before this one; calls that overlapped (``asyncio.gather``, parallel tools)
        may come in either order, as their completion order was a race.
        """
        if not is_ordered(boundary):
            return None
        with self._lock:
            return self._completed.get(scope_of(stream, boundary, name), 0)

    def _opaque(self, call: Call, stream: str, text: str, invoke: Callable[[], T], *, encode: bool) -> T:
        after = self._after(call.boundary, call.name, stream)
        token = INSIDE.set(True)
        try:
            result = invoke()
        except BaseException as exc:
            INSIDE.reset(token)
            self._add(call.boundary, call.name, stream, *_arguments_of(call, text), None, error_of(exc), after=after)
            raise
        INSIDE.reset(token)
        if inspect.isawaitable(result):
            return self._settle(call, stream, text, result, encode)  # type: ignore[return-value]
        self._add_result(call, stream, text, result, encode, after)
        return result

    async def _settle(self, call: Call, stream: str, text: str, awaitable: Awaitable[Any], encode: bool) -> Any:
        return await self._around_async(
            BoundaryCall(call.boundary, call.name, stream=stream, arguments_text=text), lambda: awaitable, encode
        )

    async def _around_async(
        self, call: BoundaryCall, invoke: Callable[[], Awaitable[Any]], encode: bool = False
    ) -> Any:
        after = self._after(call.boundary, call.name, call.stream)
        token = INSIDE.set(True)
        try:
            result = await invoke()
        except BaseException as exc:
            stored, digest = _arguments_of(call, call.arguments_text)
            self._add(call.boundary, call.name, call.stream, stored, digest, None, error_of(exc), after=after)
            raise
        finally:
            INSIDE.reset(token)
        self._add_result(call, call.stream, call.arguments_text, result, encode, after)
        return result

    def _add_result(self, call: Call, stream: str, text: str, result: Any, encode: bool, after: int | None) -> None:
        """Record what the call returned, in its stored form; the caller hands ``result`` itself on."""
        try:
            if encode:
                value = encode_result(result)
            elif isinstance(call, BoundaryCall) and call.record_as is not None:
                value = call.record_as(result)
            else:
                value = result
        except Exception:
            with self._lock:
                self.dropped += 1
            _log.exception("otel-replay recording %s: dropped a result it could not store", self.session_id)
            return
        self._add(call.boundary, call.name, stream, *_arguments_of(call, text), value, None, after=after)

    async def around_async(self, call: Call, invoke: Callable[[], Awaitable[Any]]) -> Any:
        """The awaitable form of :meth:`around`, for async model and tool calls from the instrumentation."""
        if INSIDE.get() or self._closed or isinstance(call, BoundaryCall):
            return await invoke()
        text = stable_json(dict(call.arguments))
        stream = stream_key(call.boundary, call.name)
        if call.boundary == "tool":
            self._warn_unmatchable(call.name, text)
            opaque = BoundaryCall(call.boundary, call.name, stream=stream, arguments_text=text)
            return await self._around_async(opaque, invoke, encode=True)
        self._add(call.boundary, call.name, stream, text, None, None, None, transparent=True)
        return await invoke()

    def decision(self, record: DecisionRecord) -> None:
        """A decision the agent made inside the recording (reported by ``audit()`` once sealed)."""
        text = decision_arguments(record)
        stream = stream_key("decision", record.decision_type)
        after = self._after("decision", record.decision_type, stream)
        self._add("decision", record.decision_type, stream, text, None, None, None, ref=record.record_id, after=after)

    def decision_lost(self, record_id: str, decision_type: str, why: str) -> None:
        """A decision made inside the recording whose record could not be sealed: counted as dropped."""
        with self._lock:
            self.dropped += 1
        _log.error(
            "otel-replay recording %s: decision %s (%s) is not in the recording: %s",
            self.session_id,
            record_id,
            decision_type,
            why,
        )

    def contract_verdict(self, text: str) -> None:
        """A governed session's verdict made inside the recording (``text``: what decides it, canonical JSON).

        Reported by every enforcement decision of :func:`otel_replay.govern`, in the order they happen; kept as
        an ordered event, so a rerun compares each verdict at its place.
        """
        stream = stream_key("contract", "verdict")
        after = self._after("contract", "verdict", stream)
        self._add("contract", "verdict", stream, text, None, None, None, after=after)

    # --- storing --------------------------------------------------------------
    def _add(self, boundary: str, name: str, *args: Any, **kwargs: Any) -> None:
        # Recording must never change the program's behaviour: a failure here drops this one event,
        # named, counted and logged, and the final chunk says how many were dropped.
        try:
            self._store_event(boundary, name, *args, **kwargs)
        except Exception as exc:
            with self._lock:
                self.dropped += 1
            _log.error(
                "otel-replay recording %s: dropped the %s %s event, which cannot be stored: %s: %s",
                self.session_id,
                boundary,
                name,
                type(exc).__name__,
                str(exc)[:300],
            )

    def _store_event(
        self,
        boundary: str,
        name: str,
        stream: str,
        arguments: str,
        digest: str | None,
        value: Any,
        error: dict[str, str] | None,
        *,
        transparent: bool = False,
        ref: str = "",
        after: int | None = None,
    ) -> None:
        ctx = trace.get_current_span().get_span_context()
        event = Event(
            seq=0,
            boundary=boundary,
            name=name,
            stream=stream,
            # Stored redacted; matched on the hash of the arguments as the call had them (HTTP arguments are
            # redacted before both, as a body is matched redacted).
            arguments=arguments if boundary == "http" else redact_json_text(arguments),
            args_hash=digest if digest is not None else arguments_hash(boundary, name, arguments),
            value=value,
            error=error,
            transparent=transparent,
            trace_id=f"{ctx.trace_id:032x}" if ctx.is_valid else "",
            span_id=f"{ctx.span_id:016x}" if ctx.is_valid else "",
            thread=threading.current_thread().name,
            ref=ref,
            after=None if transparent else after,
        )
        event.value_hash()  # may refuse the value: before the event takes a sequence number
        where = f"recording {self.session_id} event {boundary} {name}"
        with self._lock:
            if self._closed:
                return
            # Serialised (and checked storable) here, under the lock, before the number is taken for good:
            # an event that cannot be stored is dropped alone and leaves no gap in the sequence.
            event.seq = self._seq
            text = canonical_json(event.to_json(), where=where)
            if not text.isascii():
                text.encode("utf-8")  # a lone surrogate would fail the whole chunk when written
            self._seq += 1
            if event.after is not None:
                scope = scope_of(stream, boundary, name)
                self._completed[scope] = self._completed.get(scope, 0) + 1
            if not event.transparent:  # a model call's note: its HTTP exchange below is what counts
                self.fingerprint.add_event(event)
            self._pending.append(text)
            self._pending_bytes += len(text)
            self.events += 1
            if len(self._pending) >= self._flush_events or self._pending_bytes >= self._flush_bytes:
                try:
                    self._flush(final=False)
                except Exception as exc:  # the events stay pending, in order, and go with the next chunk
                    self._flush_failed(exc)
                else:
                    self._flush_events, self._flush_bytes = CHUNK_EVENTS, CHUNK_BYTES

    def _flush_failed(self, exc: Exception) -> None:
        """A chunk could not be written: retried once twice as much is pending (linear cost), logged briefly."""
        self._flush_failures += 1
        self._flush_events = 2 * len(self._pending)
        self._flush_bytes = 2 * max(self._pending_bytes, CHUNK_BYTES)
        if self._flush_failures == 1:
            _log.exception("otel-replay recording %s: a chunk could not be written yet", self.session_id)
        else:
            _log.error(
                "otel-replay recording %s: a chunk still cannot be written (%d tries, %d events pending): %s: %s",
                self.session_id,
                self._flush_failures,
                len(self._pending),
                type(exc).__name__,
                str(exc)[:300],
            )

    def _flush(self, *, final: bool, outcome: str = "") -> None:
        # Called with the lock held, so chunks are sealed in order. Each event is already canonical JSON:
        # the chunk is their array, byte for byte what canonical_json of the list would write.
        events = self._pending
        first = self._seq - len(events)
        attrs: dict[str, Any] = {
            sc.KIND: sc.KIND_RECORDING,
            sc.RECORD_SOURCE: "recording",
            sc.SESSION_ID: self.session_id,
            sc.RECORDING_FORMAT: RECORDING_FORMAT,
            sc.RECORDING_ID: self.recording_id,
            sc.RECORDING_CHUNK: self._chunk,
            sc.RECORDING_FIRST_SEQ: first,
            sc.RECORDING_EVENTS: "[" + ",".join(events) + "]",
            sc.RECORDING_FINAL: final,
        }
        if final:
            # A lone surrogate in the message (a non-UTF-8 file name) would make the chunk unsealable: escaped.
            outcome = redact(outcome.encode("utf-8", "backslashreplace").decode("utf-8"))
            attrs[sc.RECORDING_FINGERPRINT] = self.fingerprint.hexdigest()
            attrs[sc.RECORDING_OUTCOME] = outcome
            if self._output is not None:
                attrs[sc.RECORDING_OUTPUT] = self._output
            if self.dropped:
                attrs[sc.RECORDING_OUTCOME] = f"{outcome} (dropped {self.dropped} event(s) it could not store)"
        record_id = new_id()
        attrs[sc.RECORD_ID] = record_id
        token = INSIDE.set(True)
        try:
            # On failure the events stay pending (the next flush retries them): nothing is lost in between.
            get_recorder().emit(sc.SPAN_RECORDING, record_id, attrs)
        finally:
            INSIDE.reset(token)
        self._pending, self._pending_bytes = [], 0
        self.chunks.append(record_id)
        self._chunk += 1

    def finish(self, outcome: str) -> str:
        """Write the final chunk; returns the session's causal fingerprint.

        Never raises: the agent's run is over and its result is the caller's. A final chunk that
        cannot be written is logged, its events counted in :attr:`dropped`, and the recording reads
        as ended early.
        """
        with self._lock:
            if not self._closed:
                self._closed = True
                try:
                    self._flush(final=True, outcome=outcome)
                except Exception:
                    self.dropped += len(self._pending)
                    self.finish_failed = True
                    _log.exception(
                        "otel-replay recording %s: its final chunk (%d event(s)) could not be written; "
                        "the recording ends early",
                        self.session_id,
                        len(self._pending),
                    )
            return self.fingerprint.hexdigest()


def _arguments_of(call: Call, text: str) -> tuple[str, str | None]:
    """The arguments text to store for ``call`` and its match hash (``None``: the hash of that text).

    Never raises (the call already ran): arguments that cannot be read are stored as unmatchable, named.
    """
    if not isinstance(call, BoundaryCall):
        return text, None
    try:
        return call.stored_arguments(), call.args_hash
    except Exception as exc:
        return json.dumps({"$unmatchable": f"its arguments ({type(exc).__name__} while reading them)"}), None


_active_lock = threading.Lock()


@contextmanager
def recording(session_id: str | None = None, *, agent_id: str | None = None) -> Iterator[RecordMode | None]:
    """Record every nondeterministic input of the code inside, as sealed spans of ``session_id``.

    Clock reads, entropy draws, HTTP exchanges (httpx, requests), model calls
    and tool results made by the agent's code are captured in call order,
    under the current span, and written through the configured pipeline
    (call :func:`otel_replay.configure` first so they land in the dataset).
    The session id (a new UUID when not given) is put in scope, so decisions
    made inside carry it. Yields the :class:`RecordMode` (``.fingerprint``).

    Inside a rerun this is a no-op (yields ``None``): the rerun is serving
    this recording's values, not making a new one.

    Raises:
        ConfigError: another recording is already active in this process, or the tracer's provider would
            cut the sealed chunks (an attribute length limit) or the signing key is malformed: checked
            before the code inside runs.

    """
    if Interceptor.current_rerun() is not None:
        yield None
        return
    sid = session_id or str(new_id())
    mode = RecordMode(sid)
    if get_recorder().goes_nowhere:
        _log.warning(
            "otel-replay recording %s: no tracer provider is configured, so the recording is not stored anywhere "
            "(call otel_replay.configure(...) first, or run under opentelemetry-instrument)",
            sid,
        )
    # Resolves the signing key and vets the tracer now, as the whole-process recording does: a provider that
    # would cut the sealed chunks (an attribute length limit) is refused before the agent runs, not per event.
    get_recorder().chain  # noqa: B018
    if not _active_lock.acquire(blocking=False):
        raise ConfigError("a recording is already active in this process; recordings do not nest")
    try:
        with session_scope(sid, agent_id=agent_id), Interceptor(mode):
            outcome = "returned"
            try:
                yield mode
            except BaseException as exc:
                outcome = outcome_of(exc)
                raise
            finally:
                mode.finish(outcome)
    finally:
        _active_lock.release()
