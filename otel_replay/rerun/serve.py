"""Rerun mode: serve every recorded value back, in recorded order, and say precisely where a run diverges.

Recorded events are split into streams (boundary, name, consumer, correlation
id in scope). A call takes the next event of its stream in O(1) - a dict
lookup and a ``deque.popleft`` - so two identical requests get their own two
responses, and one added ``random`` call does not shift every ``uuid4`` after
it. The event's argument hash must equal the call's; when it does not, or the
stream is empty, the step is a divergence: ``strict`` raises, ``relaxed``
warns, keeps the first divergence for the result, and goes on (serving the
recorded value on an argument mismatch; on a miss an HTTP call is refused as a
leak unless ``allow_live`` names its host and port, a clock or entropy read runs live).

A format-3 recording is also served in order: an ordered call (tool, HTTP,
decision, act: not a clock read or a random draw) must take the next recorded
ordered event of its correlation scope, or the step is a divergence saying
what was called before what. Steps are numbered as the recording numbers its
events, everywhere. The first divergence is the verdict: an error raised into
the agent is recorded as the divergence before it is raised, and a strict
rerun whose agent caught it still ends in that first error.
"""

from __future__ import annotations

import itertools
import json
import logging
import sys
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, NoReturn, TypeVar
from urllib.parse import urlsplit

from otel_replay._seam import Call
from otel_replay.errors import DeterminismLeakError, ReplayMismatchError, RerunError
from otel_replay.records import DecisionRecord
from otel_replay.rerun.callers import INSIDE
from otel_replay.rerun.codec import arguments_hash, decode_result, redact_json_text, stable_json, unmatchable
from otel_replay.rerun.divergence import (
    Divergence,
    capped_reason,
    compare_candidate,
    consumer,
    describe,
    describe_call,
    describe_text,
    first_difference,
    mismatch_at,
)
from otel_replay.rerun.events import (
    BoundaryCall,
    Event,
    Fingerprint,
    decision_arguments,
    describe_event,
    is_ordered,
    scope_of,
    stream_key,
    value_hash,
)
from otel_replay.rerun.guards import LiveAllowList
from otel_replay.rerun.http_match import credentials_only, part_differences, split_parts

__all__ = ["CREDENTIALS", "Credentials", "Divergence", "Governance", "RerunMode"]

T = TypeVar("T")
Governance = Literal["relaxed", "strict"]
Credentials = Literal["value", "presence"]
CREDENTIALS: tuple[Credentials, ...] = ("value", "presence")
"""How a rerun compares an HTTP call's credential headers: by value (the default), or by presence only."""
_log = logging.getLogger("otel_replay.rerun")
_CANDIDATE_SCAN = 20_000
_LISTED = 1000
"""Distinct leaks (and live calls) a rerun lists; more are counted (``more_leaks``), so memory stays bounded."""


def _networked(what: str) -> bool:
    return what.startswith(("unrecorded HTTP ", "socket connect", "UDP send", "DNS lookup"))


_INTERRUPTS = frozenset({"builtins:KeyboardInterrupt", "builtins:GeneratorExit"})
"""Recorded errors that stopped the recorded run itself (Ctrl-C): never raised again in a rerun, where they would
stop ``rerun --all`` or a pytest session. ``SystemExit`` is raised again: ``rerun()`` takes it as the end of the
entrypoint (and pytest as a failure), so a run that exits inside a call is reproduced and can match."""


_CANCELLED = "asyncio.exceptions:CancelledError"
"""A recorded cancellation (a timeout, a cancelled task) is never raised again: nothing cancels in a rerun, so the
agent's ``except TimeoutError`` would not see it and it would end ``rerun()`` itself. See
:meth:`RerunMode._cancelled`."""


def _recorded_type(type_path: str) -> Any:
    module_name, _, qualname = type_path.partition(":")
    # Only a module the program already imported is looked in: a recording never makes the rerun import code.
    exc_type: Any = sys.modules.get(module_name)
    for part in qualname.split(".") if exc_type is not None else ():
        exc_type = getattr(exc_type, part, None)
    return exc_type if isinstance(exc_type, type) and issubclass(exc_type, BaseException) else None


def _raise_recorded(error: dict[str, str] | Any) -> None:
    """Raise the exception the recorded call raised (same type when it can be rebuilt)."""
    type_path = str(error.get("type", ""))
    message = str(error.get("message", ""))
    exc_type = _recorded_type(type_path)
    exc = _rebuilt(exc_type, type_path, message) if exc_type is not None else None
    if exc is not None:
        raise exc
    raise RuntimeError(f"recorded call raised {type_path}: {message}")


def _rebuilt(exc_type: Any, type_path: str, message: str) -> BaseException | None:
    try:
        built: BaseException = exc_type(message)
        return built
    except Exception:
        pass
    # A class that needs more than a message (httpx.HTTPStatusError, CalledProcessError, an error with fields):
    # built without its __init__, as a subclass made here whose str() and repr() are the recorded message (its
    # own __str__ reads fields that are not there), so the agent's `except` clauses still match and printing it
    # works; its other attributes are missing, and a note says so.
    try:
        shown: Any = type(
            exc_type.__name__,
            (exc_type,),
            {
                "__module__": exc_type.__module__,
                "__qualname__": exc_type.__qualname__,
                "__str__": lambda self: message,
                "__repr__": lambda self: f"{exc_type.__name__}({message!r})",
            },
        )
        exc: BaseException = shown.__new__(shown, message)
    except Exception:
        try:
            exc = exc_type.__new__(exc_type, message)
        except Exception:
            return None
    exc.args = (message,)
    exc.add_note(f"otel-replay: rebuilt from the recording ({type_path}); only its message was recorded")
    return exc


@dataclass
class RerunMode:
    """The seam mode of a rerun: serve the recorded events of one session."""

    rerunning: ClassVar[bool] = True  # what runs inside is a rerun: govern() then keeps its state in memory
    events: list[Event]
    governance: Governance = "relaxed"
    complete: bool = True
    fingerprint: Fingerprint = field(default_factory=Fingerprint)
    divergence: Divergence | None = None
    warnings: list[str] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)
    decisions: list[tuple[str, DecisionRecord]] = field(default_factory=list)
    """(original record id, the rerun's record) for each decision the rerun reproduced."""
    ended_early: bool = False
    cancelled_run: bool = False
    """The recorded run itself ended cancelled (its outcome is ``raised CancelledError``)."""
    arguments_key: bytes | None = None
    """The recording's argument-hash key (:func:`~otel_replay.rerun.codec.match_key`), in force while serving."""
    ordered: bool = True
    """Compare the order of ordered calls within each correlation scope (a format-3 recording)."""
    first_error: RerunError | None = None
    """The first error raised into the agent: a strict rerun ends in it even when the agent caught it."""
    allow_live: LiveAllowList | None = None
    """``host:port`` pairs an HTTP call the recording does not hold may reach live (none: refused, a leak)."""
    live: list[str] = field(default_factory=list)
    """What ran live because ``allow_live`` allowed it (each once)."""
    more_leaks: int = 0
    """Leaks past the first :data:`_LISTED` distinct ones: counted, not listed."""
    credentials: Credentials = "value"
    """``"presence"``: an HTTP call whose only differences are the values of credential headers (sent on both
    sides, with one scheme) matches its recorded step (codec 3, which stores the part digests)."""

    def __post_init__(self) -> None:
        self.streams: dict[str, deque[Event]] = {}
        self.notes: dict[str, deque[Event]] = {}
        """Model-call notes: checked when the rerun makes the call, never required (the HTTP below is)."""
        for event in self.events:
            target = self.notes if event.transparent else self.streams
            target.setdefault(event.stream, deque()).append(event)
        self._recorded = {stream: len(queue) for stream, queue in self.streams.items()}
        self._order: dict[str, list[Event]] = {}
        """Per correlation scope, its recorded ordered events, in recorded (completion) order (format 3)."""
        self._done: dict[str, int] = {}
        """Per scope, how many of its first recorded ordered events the rerun has all made."""
        self._served: set[int] = set()
        """Recorded ordered events made beyond that prefix (dropped from here as the prefix passes them)."""
        for event in self.events:
            if self.ordered and not event.transparent and is_ordered(event.boundary):
                self._order.setdefault(scope_of(event.stream, event.boundary, event.name), []).append(event)
        self._reached = 0
        """One past the highest recorded step served: where a call the recording does not hold is placed."""
        self._counter = itertools.count()
        self._lock = threading.Lock()
        self._leak_set: set[str] = set()
        self.steps = 0

    # --- the seam -----------------------------------------------------------
    def around(self, call: Call, invoke: Callable[[], T]) -> T:
        """Serve the call from the recording (or diverge)."""
        if INSIDE.get():
            return invoke()
        how, value = self._serve(call)
        is_async = isinstance(call, BoundaryCall) and call.is_async
        if how == "value":
            return _ready(value) if is_async else value  # type: ignore[return-value]
        if how == "live":
            if is_async:
                return _live_async(invoke)  # type: ignore[arg-type, return-value]
            token = INSIDE.set(True)
            try:
                return invoke()
            finally:
                INSIDE.reset(token)
        return invoke()

    async def around_async(self, call: Call, invoke: Callable[[], Awaitable[Any]]) -> Any:
        """The awaitable form of :meth:`around`, for async model and tool calls from the instrumentation."""
        if INSIDE.get():
            return await invoke()
        how, value = self._serve(call)
        if how == "value":
            return value
        if how == "live":
            return await _live_async(invoke)
        return await invoke()

    def _serve(self, call: Call) -> tuple[str, Any]:
        """Match one call: ``("value", v)`` to serve, ``("invoke", None)`` to run it, ``("live", None)`` on a miss."""
        next(self._counter)
        # An HTTP call is matched on its digest alone: its stored text (redacted, with the part digests that
        # name what differs) is built only when a divergence shows it (``shown``).
        lazy = call if isinstance(call, BoundaryCall) and call.boundary == "http" else None
        text = ""
        if isinstance(call, BoundaryCall):
            stream, digest, opaque = call.stream, call.args_hash, True
            if lazy is None:
                text = call.arguments_text
        else:
            text = stable_json(dict(call.arguments))
            stream = stream_key(call.boundary, call.name)
            digest = arguments_hash(call.boundary, call.name, text)
            opaque = call.boundary == "tool"
        if call.boundary != "http":  # shown and sealed redacted, as recorded; matched above on the digest
            text = redact_json_text(text)

        def shown() -> str:
            return lazy.stored_arguments() if lazy is not None else text

        if not opaque and not isinstance(call, BoundaryCall):
            self._note(call, stream, shown(), digest)
            return "invoke", None
        queue = self.streams.get(stream)
        event = queue.popleft() if queue else None
        if event is None:
            self._miss(call, stream, shown(), digest)
            return "live", None
        step = self._take(event)
        after = self._check_order(event, call.boundary, call.name, stream, shown)
        opaque_value = None if call.boundary == "http" else unmatchable(shown())
        if opaque_value is not None:
            self._diverge_call(
                step,
                f"{call.boundary} {call.name} was called with {opaque_value}, which has no value representation, "
                "so the call cannot be compared with the recorded one",
                call,
                stream,
                shown(),
                event,
                exclude=event,
            )
        elif event.args_hash != digest:
            if self.credentials == "presence" and self._credentials_differ(event, shown()):
                digest = event.args_hash  # the same call, with other credentials: folded as the recorded one
            else:
                self._other_arguments(step, call, stream, shown(), event)
                _log.warning("otel-replay rerun: step %d called with other arguments; serving the recorded value", step)
        self.fingerprint.add(stream, call.boundary, call.name, digest, event.value_hash(), after)
        if event.error is not None:
            if str(event.error.get("type", "")) == _CANCELLED:
                self._cancelled(step, call, stream, shown(), event)
            if str(event.error.get("type", "")) in _INTERRUPTS:
                self.ended_early = True
                raise mismatch_at(
                    step,
                    f"the recorded run was interrupted here ({event.error.get('type')}) during "
                    f"{describe(event)}; the rerun stops where the recording does",
                    call,
                    shown(),
                    event,
                )
            _raise_recorded(event.error)
        if event.transparent or not opaque:
            return "invoke", None
        value = event.value
        if isinstance(value, dict) and "$unrecordable" in value and call.boundary != "http":
            # Recorded as the divergence before it is raised: an agent that catches it cannot end matched.
            self._refuse(
                self._diverge_call(
                    step,
                    f"{call.boundary} {call.name} returned a value the recording could not hold "
                    f"({value['$unrecordable']}); it cannot be served without running it",
                    call,
                    stream,
                    shown(),
                    event,
                )
            )
        if isinstance(call, BoundaryCall):
            capped = event.value.get("capped") if call.boundary == "http" and isinstance(event.value, dict) else None
            if capped:
                self._diverge_call(step, capped_reason(capped), call, stream, shown(), event)
            return "value", event.value
        try:
            return "value", decode_result(value)
        except (LookupError, TypeError, ValueError) as exc:
            reason = f"{call.boundary} {call.name}: the recorded result cannot be rebuilt ({exc})"
        self._refuse(self._diverge_call(step, reason, call, stream, shown(), event))

    def _take(self, event: Event) -> int:
        """The recorded step of a served ``event`` (its sequence number); the rerun has reached past it."""
        with self._lock:
            self._reached = max(self._reached, event.seq + 1)
        return event.seq

    def _prefix(self, scope: str) -> int:
        """How many of ``scope``'s first recorded ordered events the rerun has all made (lock held)."""
        events, done = self._order.get(scope, ()), self._done.get(scope, 0)
        while done < len(events) and events[done].seq in self._served:
            self._served.discard(events[done].seq)
            done += 1
        self._done[scope] = done
        return done

    def _position(self, boundary: str, name: str, stream: str) -> int:
        """The step of a call the recording does not hold: where its scope's recorded order had reached."""
        if self.ordered and is_ordered(boundary):
            scope = scope_of(stream, boundary, name)
            with self._lock:
                done, events = self._prefix(scope), self._order.get(scope, [])
                if done < len(events):
                    return events[done].seq
        with self._lock:
            return self._reached

    def _place(self, event: Event) -> tuple[Event | None, int | None]:
        """Make ``event`` in its scope's order: (the event that had to come first or ``None``, the order folded).

        The recording completed ``event.after`` ordered calls of the scope before ``event`` started: the rerun
        must have made all of those. Calls that overlapped it in the recording may come either side.
        """
        if not self.ordered or event.transparent or not is_ordered(event.boundary):
            return None, event.after
        scope = scope_of(event.stream, event.boundary, event.name)
        with self._lock:
            done = self._prefix(scope)
            self._served.add(event.seq)
            self._prefix(scope)
            need = event.after or 0
            if done >= need:
                return None, event.after
            return self._order[scope][done], done

    def _check_order(self, event: Event, boundary: str, name: str, stream: str, shown: Callable[[], str]) -> int | None:
        """A served ordered ``event`` must follow every call the recording completed before it started.

        Else the order diverged (``shown`` gives the call's text for it). Returns the order folded into the
        fingerprint.
        """
        before, after = self._place(event)
        if before is None:
            return after
        text = shown()
        made, first = describe_event(boundary, name, ""), describe_event(before.boundary, before.name, "")
        self._diverge(
            before.seq,
            self._no_verdict(before)
            + f"called out of order: the rerun made {made} (recorded step {event.seq}) before {first} "
            f"(recorded step {before.seq}), which the recording had made before {made} began",
            describe(before),
            describe_call(boundary, name, stream, text),
            boundary,
            name,
            stream,
            text,
            exclude=event,
        )
        return after

    def _refuse(self, found: Divergence) -> NoReturn:
        """Raise the divergence ``found`` into the agent (relaxed too: the call cannot be served)."""
        self._raise(
            ReplayMismatchError(
                str(found), step=found.step, expected=found.expected, actual=found.actual, candidates=found.candidates
            )
        )

    def _raise(self, error: RerunError) -> NoReturn:
        """Raise ``error`` into the agent, remembering the first: it stays the verdict if the agent catches it."""
        with self._lock:
            if self.first_error is None:
                self.first_error = error
        raise error

    def _cancelled(self, step: int, call: Call, stream: str, text: str, event: Event) -> None:
        """The recorded call was cancelled: the rerun stops here, as it cannot cancel anything.

        When the cancellation ended the recorded run (nobody caught it), it is an interruption, as Ctrl-C is:
        the rerun ended early where the recording did. When the recorded run caught it and went on (a timeout
        turned into ``TimeoutError``), what the agent did next depended on timing the rerun cannot reproduce:
        a divergence, so the run never counts as matched.
        """
        where = describe(event)
        if self.cancelled_run:
            self.ended_early = True
            raise ReplayMismatchError(
                f"step {step}: the recorded run was cancelled here (CancelledError) during {where}; "
                "the rerun stops where the recording does",
                step=step,
                expected=where,
                actual=describe_text(call.boundary, call.name, text),
            )
        reason = (
            "the recorded call was cancelled (a timeout or a cancelled task) and the recorded run went on; "
            "a rerun cannot reproduce the cancellation"
        )
        self._refuse(
            self._diverge(
                step,
                reason,
                where,
                describe_text(call.boundary, call.name, text),
                call.boundary,
                call.name,
                stream,
                text,
            )
        )

    def _note(self, call: Call, stream: str, text: str, digest: str) -> None:
        """A model call (run for real; its HTTP is served): check it against the recorded note, if any."""
        queue = self.notes.get(stream)
        event = queue.popleft() if queue else None
        if event is not None and event.args_hash != digest:
            self._other_arguments(event.seq, call, stream, text, event)

    @staticmethod
    def _credentials_differ(event: Event, text: str) -> list[str]:
        """The credential headers that alone tell an HTTP call from its recorded ``event`` (else empty)."""
        if event.boundary != "http":
            return []
        recorded, made = split_parts(event.arguments)[1], split_parts(text)[1]
        if recorded is None or made is None:
            return []
        return credentials_only(recorded, made)

    def _other_arguments(self, step: int, call: Call, stream: str, text: str, event: Event) -> None:
        """The call matched a recorded step but not its arguments: show both around the first difference.

        When what differs is redacted in the text shown (an HTTP call recorded with part digests), the parts
        that differ are named instead; a difference in credential headers alone says how to rerun.
        """
        reason = f"{call.boundary} {call.name} called with other arguments than recorded"
        redacted = ""
        recorded_text, actual_text = event.arguments, text
        if call.boundary == "http":
            recorded_text, recorded = split_parts(event.arguments)
            actual_text, made = split_parts(text)
            if recorded is not None and made is not None:
                redacted = ", ".join(part_differences(recorded, made))
                names = credentials_only(recorded, made)
                if names:
                    reason += (
                        f": only a credential header differs ({', '.join(names)}): the rerun sent other "
                        "credentials than the recorded run; rerun with the recorded run's credentials, or with "
                        'credentials="presence" (--credentials presence) to compare credentials by presence only'
                    )
        recorded_args, actual_args = first_difference(recorded_text, actual_text, redacted=redacted)
        self._diverge(
            step,
            reason,
            recorded_args,
            actual_args,
            call.boundary,
            call.name,
            stream,
            text,
            exclude=event,
        )

    def decision(self, record: DecisionRecord) -> None:
        """A decision the rerun made: check it against the recorded one at this point."""
        next(self._counter)
        text = decision_arguments(record)
        stream = stream_key("decision", record.decision_type)
        digest = arguments_hash("decision", record.decision_type, text)
        text = redact_json_text(text)  # shown and sealed redacted, as recorded
        queue = self.streams.get(stream)
        event = queue.popleft() if queue else None
        actual = describe_event("decision", record.decision_type, text, limit=400)
        if event is None:
            self.fingerprint.add(stream, "decision", record.decision_type, digest, value_hash(None))
            self._diverge(
                self._position("decision", record.decision_type, stream),
                "a decision the recording does not hold",
                "",
                actual,
                "decision",
                record.decision_type,
                stream,
                text,
            )
            return
        step = self._take(event)
        after = self._check_order(event, "decision", record.decision_type, stream, lambda: text)
        self.fingerprint.add(stream, "decision", record.decision_type, digest, value_hash(None), after)
        opaque_value = unmatchable(text)
        if event.args_hash != digest or opaque_value is not None:
            self._diverge(
                step,
                "the decision differs from the recorded one"
                if opaque_value is None
                else f"the decision holds {opaque_value}, which has no value representation, so it cannot be compared",
                describe_event("decision", event.name, event.arguments, limit=400),
                actual,
                "decision",
                record.decision_type,
                stream,
                text,
                exclude=event,
            )
            return
        with self._lock:
            self.decisions.append((event.ref, record))

    def decision_lost(self, record_id: str, decision_type: str, why: str) -> None:
        """A decision the rerun made whose record could not be sealed: it cannot be compared, so no match."""
        next(self._counter)
        stream = stream_key("decision", decision_type)
        queue = self.streams.get(stream)
        event = queue.popleft() if queue else None
        if event is not None:  # it takes its recorded place, so the decisions after it are compared with theirs
            step = self._take(event)
            self._place(event)
        else:
            step = self._position("decision", decision_type, stream)
        actual = f"decision {decision_type} {record_id} ({why})"
        self._diverge(
            step,
            "a decision whose record could not be sealed, so it was not compared",
            "",
            actual,
            "decision",
            decision_type,
            stream,
            "",
        )

    def contract_verdict(self, text: str) -> None:
        """A governed session's verdict the rerun made: checked in order against the recorded one.

        A verdict the recording does not hold here, or another one, is a divergence saying the contract
        verdict differs, with both verdicts and the first field that differs; so a rerun under changed
        contracts names the first step whose verdict changed. A recording that holds no verdict at all (made
        before verdicts were recorded) is not checked for them.
        """
        if not self._holds_verdicts():
            return
        next(self._counter)
        stream = stream_key("contract", "verdict")
        digest = arguments_hash("contract", "verdict", text)
        text = redact_json_text(text)  # shown redacted, as recorded
        queue = self.streams.get(stream)
        event = queue.popleft() if queue else None
        actual = describe_event("contract", "verdict", text, limit=600)
        if event is None:
            self.fingerprint.add(stream, "contract", "verdict", digest, value_hash(None))
            reason = "the contract verdict differs: the recording holds no contract verdict here"
            step = self._position("contract", "verdict", stream)
            self._diverge(step, reason, "", actual, "contract", "verdict", stream, text)
            return
        step = self._take(event)
        if event.args_hash != digest:
            change = self._verdict_change(event.arguments, text)
            reason = f"the contract verdict differs from the recorded one ({change})"
            expected = describe_event("contract", "verdict", event.arguments, limit=600)
            self._diverge(step, reason, expected, actual, "contract", "verdict", stream, text, exclude=event)
        after = self._check_order(event, "contract", "verdict", stream, lambda: text)
        self.fingerprint.add(stream, "contract", "verdict", digest, value_hash(None), after)

    def _holds_verdicts(self) -> bool:
        """Whether the recording holds contract verdicts (computed once)."""
        held = self.__dict__.get("_verdicts")
        if held is None:
            held = self.__dict__["_verdicts"] = any(event.boundary == "contract" for event in self.events)
        return bool(held)

    @staticmethod
    def _verdict_change(recorded: str, actual: str) -> str:
        """The first field of two verdict texts that differs, both ways (else their first differing characters)."""
        try:
            before, after = json.loads(recorded), json.loads(actual)
        except ValueError:
            before = after = None
        if isinstance(before, dict) and isinstance(after, dict):
            order = ("mode", "outcome", "phase_before", "phase_after", "calls", "failures", "precheck", "narrowed")
            for name in (*order, *sorted(set(before) | set(after))):
                if before.get(name) != after.get(name):
                    was, now = stable_json(before.get(name))[:300], stable_json(after.get(name))[:300]
                    return f"{name}: recorded {was}, rerun {now}"
        was, now = first_difference(recorded, actual)
        return f"recorded {was}, rerun {now}"

    @staticmethod
    def _no_verdict(event: Event) -> str:
        """How a divergence at a recorded contract verdict the rerun did not make begins (else ``""``)."""
        return "the contract verdict differs: the rerun made none here; " if event.boundary == "contract" else ""

    # --- divergence -----------------------------------------------------------
    def _miss(self, call: Call, stream: str, text: str, digest: str) -> None:
        step = self._position(call.boundary, call.name, stream)
        actual = describe_call(call.boundary, call.name, stream, text)
        if not self.complete and self.remaining() == 0:
            self.ended_early = True
            raise ReplayMismatchError(
                f"step {step}: the recording ended early (its process stopped before the recording was finished); "
                f"the rerun reached its end and wanted: {actual}",
                step=step,
                actual=actual,
            )
        held = self._recorded.get(stream, 0)
        reason = "a call the recording does not hold"
        if held:
            reason += f" (it holds {held} such call(s) and this is call {held + 1})"
        leak = call.boundary in ("clock", "entropy")
        if leak:
            reason += (
                f"; {call.boundary} reads are served per consumer, the function that makes them "
                f"({consumer(stream) or 'unknown'}), and the recording holds no more such reads by it"
            )
        found = self._diverge(step, reason, "", actual, call.boundary, call.name, stream, text, leak=leak)
        if call.boundary in ("act", "tool"):
            # Running it live would act on the world: never, in either governance level.
            self._refuse(
                Divergence(
                    step,
                    f"{reason}; a rerun does not run tools or commit actions for real",
                    "",
                    actual,
                    found.candidates,
                )
            )
        if call.boundary == "http" and not self._allowed_live(call):
            # Nothing leaves the process unless allowed: refused in relaxed too, an error where the call was made.
            self.leak(f"unrecorded HTTP {call.name}", refuse=True)
        if call.boundary == "http":
            self.ran_live(f"unrecorded HTTP {call.name}")
        _log.warning("otel-replay rerun: step %d is not recorded (%s); running it live", step, actual)
        self.fingerprint.add(stream, call.boundary, call.name, digest, "live")

    def _allowed_live(self, call: Call) -> bool:
        """Whether ``allow_live`` lets this unrecorded HTTP call go to its host and port."""
        if not self.allow_live:
            return False
        url = urlsplit(call.name.partition(" ")[2])
        try:
            port = url.port or {"http": 80, "https": 443}.get(url.scheme.lower())
        except ValueError:
            return False
        return self.allow_live.allows(url.hostname, port)

    def _diverge_call(
        self, step: int, reason: str, call: Call, stream: str, text: str, event: Event, *, exclude: Event | None = None
    ) -> Divergence:
        """:meth:`_diverge` at a served call: the recorded ``event`` against the call made (``text``)."""
        expected, actual = describe(event), describe_text(call.boundary, call.name, text)
        return self._diverge(step, reason, expected, actual, call.boundary, call.name, stream, text, exclude=exclude)

    def _diverge(
        self,
        step: int,
        reason: str,
        expected: str,
        actual: str,
        boundary: str,
        name: str,
        stream: str,
        text: str,
        *,
        exclude: Event | None = None,
        leak: bool = False,
    ) -> Divergence:
        # Only the divergence that is kept (the first) or raised (strict) is explained: the candidate
        # search scans the recording, and a relaxed rerun diverging at every step must stay O(1) per step.
        explain = self.divergence is None or self.governance == "strict"
        candidates = self._candidates(boundary, name, stream, text, exclude) if explain else []
        found = Divergence(step, reason, expected, actual, tuple(candidates))
        with self._lock:
            if self.divergence is None:
                self.divergence = found
            self.warnings.append(f"step {step}: {reason}: {actual}")
        if self.governance == "strict":
            if leak:
                self._raise(DeterminismLeakError(str(found), step=step, call=actual))
            self._refuse(found)
        return found

    def _candidates(self, boundary: str, name: str, stream: str, text: str, exclude: Event | None) -> list[str]:
        scored: list[tuple[int, int, str]] = []
        pool: Iterable[Event] = itertools.islice(
            # list(q): a copy taken at once, as other threads may be consuming the same queues meanwhile
            (e for q in self.streams.values() for e in list(q) if e.boundary == boundary),
            _CANDIDATE_SCAN,
        )
        if exclude is not None:
            pool = itertools.chain([exclude], pool)
        for event in pool:
            score, line = compare_candidate(event, boundary, name, stream, text)
            scored.append((-score, event.seq, line))
        scored.sort()
        return [line for _, _, line in scored[:3]]

    def leak(self, what: str, *, refuse: bool = False) -> None:
        """The rerun reached outside the recording (a file, DNS, a socket, a process, an unrecorded HTTP call).

        Kept once per distinct ``what`` (a leak is not a step: it takes no step number), and raised as a
        :class:`DeterminismLeakError` where the call was made when ``refuse`` is set or the rerun is strict.
        """
        message = f"{what} outside the recording"
        with self._lock:
            if message not in self._leak_set:
                if len(self.leaks) < _LISTED:
                    self._leak_set.add(message)
                    self.leaks.append(message)
                    _log.debug("otel-replay rerun: %s", message)
                else:
                    self.more_leaks += 1
        if refuse or self.governance == "strict":
            hint = "; allow_live=['host:port'] lets a host through" if refuse and _networked(what) else ""
            # Remembered like any error raised into the agent: a leak the agent catches stays the verdict.
            self._raise(DeterminismLeakError(f"{self.governance} rerun: {message}; refused{hint}", call=what))

    def ran_live(self, what: str) -> None:
        """Something ``allow_live`` allowed ran live (listed once, not a leak)."""
        with self._lock:
            if what not in self.live and len(self.live) < _LISTED:
                self.live.append(what)

    def remaining(self) -> int:
        """Recorded events not consumed yet."""
        return sum(len(q) for q in self.streams.values())

    def first_remaining(self) -> Event | None:
        """The earliest recorded event the rerun has not consumed."""
        # Copied first: a thread the entrypoint left running may still be consuming the queues.
        left = [q[0] for q in (list(queue) for queue in self.streams.values()) if q]
        return min(left, key=lambda e: e.seq) if left else None

    def close(self) -> None:
        """After the entrypoint returned: recorded calls never made are a divergence too."""
        self.steps = next(self._counter)
        left = self.first_remaining()
        if left is None:
            return
        for queue in self.streams.values():
            for event in list(queue):
                self.fingerprint.add(event.stream, event.boundary, event.name, event.args_hash, "not made", event.after)
        with self._lock:
            if self.divergence is None:
                self.divergence = Divergence(
                    left.seq,
                    self._no_verdict(left) + f"the rerun ended; the recording holds {self.remaining()} more call(s), "
                    f"the first at step {left.seq}",
                    describe(left),
                    "",
                )


async def _ready(value: Any) -> Any:
    return value


async def _live_async(invoke: Callable[[], Awaitable[Any]]) -> Any:
    token = INSIDE.set(True)
    try:
        return await invoke()
    finally:
        INSIDE.reset(token)
