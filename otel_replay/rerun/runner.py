"""``rerun()``: run the agent again from its recording alone, prove it with the fingerprint, end in the gate."""

from __future__ import annotations

import asyncio
import functools
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from otel_replay import semconv as sc
from otel_replay._display import html_of
from otel_replay._json import canonical_json
from otel_replay.capture.context import session as session_scope
from otel_replay.capture.recorder import get_recorder
from otel_replay.errors import ConfigError, OtelReplayError, RerunError
from otel_replay.gate.execute import execute_verdict, judge_stored
from otel_replay.gate.policy import Policy, load_callable
from otel_replay.query.store import Store
from otel_replay.records import new_id
from otel_replay.redaction import message_of, redact
from otel_replay.rerun.codec import arguments_codec, redact_json_text, stable_json, text_hash, unmatchable
from otel_replay.rerun.divergence import Divergence
from otel_replay.rerun.events import Fingerprint
from otel_replay.rerun.guards import LiveAllowList, install_guards, parse_allow_live
from otel_replay.rerun.interceptor import Interceptor
from otel_replay.rerun.load import Recording, fingerprint_version, load_recording
from otel_replay.rerun.record import outcome_of
from otel_replay.rerun.serve import CREDENTIALS, Credentials, Governance, RerunMode

__all__ = ["GateResult", "RerunResult", "rerun"]


@dataclass(frozen=True)
class GateResult:
    """What the gate did for one decision the rerun reproduced."""

    record_id: str
    fix: str
    reason: str
    executed: tuple[str, ...] = ()
    error: str | None = None
    """A compensation that failed (or was refused), per action; never dropped."""

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form."""
        return {
            "record_id": self.record_id,
            "fix": self.fix,
            "reason": self.reason,
            "executed": list(self.executed),
            "error": self.error,
        }


@dataclass
class RerunResult:
    """The outcome of one :func:`rerun`."""

    session_id: str
    rerun_id: str
    governance: str
    matched: bool
    fingerprint: str
    original_fingerprint: str | None
    steps: int
    divergence: Divergence | None = None
    output: Any = None
    error: str | None = None
    """The entrypoint's exception, one line, when it raised."""
    recording_complete: bool = True
    ended_early: bool = False
    original_outcome: str = ""
    """How the recorded run ended: ``returned`` or ``raised <module>:<qualname>: <message>`` (format 3;
    ``raised <Type>: <message>`` before)."""
    outcome: str = ""
    """How the rerun ended, in the same form (compared with ``original_outcome`` under the recording's rules)."""
    outcome_matched: bool = True
    """The rerun ended as the recorded run did (compared under the recording's rules)."""
    rules: str = ""
    """What this rerun did not compare because the recording is older (``""`` for a format-3 recording)."""
    credentials: str = "value"
    """How credential headers of HTTP calls were compared: ``value`` (the default) or ``presence`` only."""
    warnings: list[str] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)
    """What reached outside the recording (each once); any leak means not matched."""
    live: list[str] = field(default_factory=list)
    """What ``allow_live`` let run live (each once): not leaks, but not served from the recording either."""
    decisions: list[tuple[str, str]] = field(default_factory=list)
    """(original record id, rerun record id) for each decision reproduced."""
    gate: list[GateResult] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> str:
        """One line: matched, diverged at step N, or errored."""
        if self.ended_early:
            return f"ended early: the recording stops after {self.steps} steps"
        if self.matched:
            return "matched"
        if self.divergence is not None:
            return f"diverged at step {self.divergence.step}"
        if not self.outcome_matched:
            return (
                f"outcome differs: the original {_cut(self.original_outcome) or 'ended differently'}, "
                f"the rerun {_cut(self.outcome) or 'ended differently'}"
            )
        if self.error is not None:
            return f"errored: {self.error}"
        if self.fingerprint != self.original_fingerprint:
            return "differs: the fingerprints are not the same"
        return "not matched"

    def _repr_html_(self) -> str:
        """The rerun as a report page in a sandboxed frame (a notebook shows it; see :mod:`otel_replay.report`)."""
        return html_of(self)

    def report(self) -> str:
        """A readable, multi-line account (what the CLI prints)."""
        lines = [
            f"session {self.session_id} rerun {self.rerun_id} ({self.governance}): {self.summary()}",
            f"  original fingerprint: {self.original_fingerprint or '(none: the recording ended early)'}",
            f"  rerun fingerprint:    {self.fingerprint}",
            f"  steps: {self.steps}",
        ]
        if self.rules:
            lines.append(f"  {self.rules}")
        if self.credentials == "presence":
            lines.append("  credentials compared by presence only")
        if self.divergence is not None:
            lines.extend("  " + line for line in str(self.divergence).splitlines())
        if self.error is not None:
            lines.append(f"  the entrypoint raised: {self.error}")
        lines.extend(f"  leak: {leak}" for leak in self.leaks[:10])
        if len(self.leaks) > 10:
            lines.append(f"  … and {len(self.leaks) - 10} more leak(s)")
        lines.extend(f"  ran live (allowed): {what}" for what in self.live[:10])
        if len(self.live) > 10:
            lines.append(f"  … and {len(self.live) - 10} more live call(s)")
        for outcome in self.gate:
            done = ", ".join(outcome.executed) or "nothing executed"
            lines.append(f"  gate {outcome.record_id}: {outcome.fix} ({done}) {outcome.error or ''}".rstrip())
        return "\n".join(lines)


def _cut(outcome: str, limit: int = 200) -> str:
    """An outcome on one short line (a summary is one row of the ``--all`` table)."""
    line = outcome.splitlines()[0] if outcome else ""
    return line if len(line) <= limit and line == outcome else line[: limit - 1] + "…"


def _entrypoint(entrypoint: Callable[..., Any] | str) -> Callable[..., Any]:
    if isinstance(entrypoint, str):
        return load_callable(entrypoint, "entrypoint")
    if not callable(entrypoint):
        raise ConfigError(f"entrypoint must be callable or 'module:function', got {type(entrypoint).__name__}")
    return entrypoint


_STOPPED = (
    "raised KeyboardInterrupt",
    "raised GeneratorExit",
    "raised builtins:KeyboardInterrupt",
    "raised builtins:GeneratorExit",
)
"""Outcomes of a run that was stopped, not one that ended (``SystemExit`` is an end: a rerun reproduces it)."""


def _cancelled(outcome: str) -> bool:
    return outcome.startswith(("raised CancelledError", "raised asyncio.exceptions:CancelledError"))


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {message_of(exc)}"  # a broken __str__ still ends the rerun, named
    first = text.splitlines()[0] if text else type(exc).__name__
    return redact(first[:500])  # shown and sealed: a message naming a URL with its key is redacted


def rerun(
    entrypoint: Callable[..., Any] | str,
    *,
    dataset: str | os.PathLike[str] | Store,
    session_id: str,
    governance: Governance = "relaxed",
    live_state: Mapping[str, Any] | None = None,
    policy: Policy | str | None = None,
    rail: Any = None,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    write: bool = True,
    allow_live: Iterable[str] = (),
    credentials: Credentials = "value",
) -> RerunResult:
    """Rerun ``entrypoint`` offline from the recording of ``session_id`` and compare it with the original.

    Every clock read, entropy draw, HTTP exchange, model call and tool result
    is served from the recording (verified first: a tampered recording is
    refused); the original run's actions are not executed again. The result
    carries both causal fingerprints, ``matched``, and on a mismatch the first
    divergent step. With ``live_state`` and ``policy`` every decision the rerun
    reproduced is replayed under the live state; with ``rail`` too, ROLLBACK and
    BLOCK verdicts compensate the original run's committed actions (each at
    most once, the latest first). The rerun's summary is written to the
    dataset as a sealed ``replay.rerun`` record (``write=False`` skips it).

    Nothing leaves the process while it runs: a network connection, DNS lookup,
    process start or HTTP call the recording does not hold is a leak, refused
    where it is made (:class:`DeterminismLeakError`), in either governance level;
    a file the agent opens is a leak too (reported when relaxed, refused when
    strict). ``allow_live`` names the ``"host:port"`` (or ``"host:*"``) pairs
    that may be reached live instead: those calls run, are listed in the
    result's ``live`` and are not leaks. A rerun with a leak never matches.

    HTTP credential headers (``Authorization``, ``X-Api-Key``: a compared header whose name is a secret's)
    are compared by value, so a rerun must send the recorded run's credentials. ``credentials="presence"``
    compares them by presence only: such a header then matches when the recorded call sent it too, with the
    same auth scheme (``Bearer``), whatever its value; everything else is still compared by value. Use it
    when the rerun cannot hold the recorded run's credentials (a CI job), knowing that a change that sends
    another account's key then passes. Recordings before format 3 always compare them by value.

    Raises:
        RecordNotFound: the session has no recording.
        UntrustedRecord: a recording chunk fails its seal check.
        DatasetError: the recording is from a newer format version or is cut in the middle.
        PolicyLoadError: ``entrypoint`` or ``policy`` is a reference that cannot be imported.
        ReplayMismatchError, DeterminismLeakError: ``governance="strict"`` and the rerun diverged or leaked.
        ConfigError: a bad ``governance``, ``credentials`` or ``allow_live`` entry (named), or options that
            do not go together.

    """
    if governance not in ("relaxed", "strict"):
        raise ConfigError(f"governance must be 'relaxed' or 'strict', got {governance!r}")
    if not isinstance(credentials, str) or credentials not in CREDENTIALS:
        raise ConfigError(f"credentials must be 'value' or 'presence', got {credentials!r:.80}")
    allowed = parse_allow_live(allow_live)
    function = _entrypoint(entrypoint)
    resolved_policy: Policy | None = load_callable(policy, "policy") if isinstance(policy, str) else policy
    if (live_state is None) != (resolved_policy is None):
        raise ConfigError("rerun(): live_state and policy go together (both, or neither)")
    if rail is not None and resolved_policy is None:
        raise ConfigError("rerun(): a rail executes verdicts, so it needs live_state and policy")
    own_store = not isinstance(dataset, Store)
    store = Store(dataset) if not isinstance(dataset, Store) else dataset
    try:
        recording = load_recording(store, session_id)
        result = _run(function, recording, governance, tuple(args), dict(kwargs or {}), allowed, credentials)
        if resolved_policy is not None and live_state is not None:
            result.gate = _gate(store, result, live_state, resolved_policy, rail)
        if write:
            _write(result)
        return result
    finally:
        if own_store:
            store.close()


def _run(
    function: Callable[..., Any],
    recording: Recording,
    governance: Governance,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    allowed: LiveAllowList,
    credentials: Credentials = "value",
) -> RerunResult:
    # A run stopped by Ctrl-C ended where it was stopped: its rerun ends there too, as a recording
    # that ended early does, rather than going on past the recorded calls.
    complete = recording.complete and not recording.outcome.startswith(_STOPPED)
    # An older recording is rerun by its own rules: no order across calls before format 3.
    mode = RerunMode(
        list(recording.events),
        governance,
        complete,
        fingerprint=Fingerprint(version=fingerprint_version(recording.codec)),
        cancelled_run=_cancelled(recording.outcome),
        ordered=recording.codec >= 3,
        arguments_key=recording.match_key,
        allow_live=allowed,
        credentials=credentials,
    )
    guards = functools.partial(install_guards, mode=mode, allow_live=allowed)
    rerun_id = new_id()
    rerun_session = f"{recording.session_id}~rerun~{rerun_id}"
    output: Any = None
    error: str | None = None
    ended = "returned"
    started = time.perf_counter()
    # An older recording is matched with the argument codec its hashes were made with.
    with session_scope(rerun_session), arguments_codec(recording.codec):
        try:
            with Interceptor(mode, guards=guards, rerun=True):
                try:
                    output = function(*args, **kwargs)
                except RerunError as exc:
                    if governance == "strict" and not mode.ended_early:
                        # The first divergence is the verdict, not a later one the agent ran into after catching it.
                        raise (mode.first_error or exc) from None
                    error, ended = _one_line(exc), _as_stored(exc)
                # An agent calling sys.exit() ends its rerun, not ours; so does a CancelledError it raises itself.
                except (Exception, SystemExit, asyncio.CancelledError) as exc:
                    error, ended = _one_line(exc), _as_stored(exc)
        finally:
            mode.close()
        if governance == "strict" and mode.first_error is not None and not mode.ended_early:
            raise mode.first_error from None  # the agent (or its framework) caught it and went on
        if recording.output is not None and error is None and mode.divergence is None:
            _compare_output(mode, recording.output, output, len(recording.events))
    seconds = time.perf_counter() - started
    fingerprint = mode.fingerprint.hexdigest()
    matched = (
        complete
        and mode.divergence is None
        and not mode.ended_early  # stopped where the recording was interrupted, even if the agent went on
        and fingerprint == recording.fingerprint
        and _same_outcome(recording.outcome, error, ended, recording.codec)
        and not mode.leaks  # it reached outside the recording: what it did is not all in the fingerprint
    )
    return RerunResult(
        session_id=recording.session_id,
        rerun_id=rerun_id,
        governance=governance,
        matched=matched,
        fingerprint=fingerprint,
        original_fingerprint=recording.fingerprint,
        steps=mode.steps,
        divergence=mode.divergence,
        output=output,
        error=error,
        recording_complete=complete,
        original_outcome=recording.outcome,
        outcome=ended,
        outcome_matched=_same_outcome(recording.outcome, error, ended, recording.codec),
        rules=recording.rules,
        credentials=credentials,
        ended_early=mode.ended_early or (not complete and mode.divergence is None),
        warnings=list(mode.warnings),
        leaks=list(mode.leaks) + ([f"{mode.more_leaks} more leak(s) not listed"] if mode.more_leaks else []),
        live=list(mode.live),
        decisions=[(original, record.record_id) for original, record in mode.decisions],
        seconds=seconds,
    )


def _compare_output(mode: RerunMode, recorded: str, output: Any, end: int) -> None:
    """The recording holds what its run returned: another value (by value) is a divergence after the last step.

    ``end`` is the step after the recording's last one (its event count), where this divergence is placed.
    """
    text = stable_json(output)
    what = unmatchable(text)
    if what is None and text_hash(text) == recorded:
        return
    shown = redact_json_text(text)
    mode.divergence = Divergence(
        end,
        "the entrypoint returned another value than the recorded run"
        if what is None
        # Two such values hash the same whatever they hold (a lock, a value past the encoder's budget).
        else f"the entrypoint returned {what}, which has no value representation, so it cannot be compared",
        f"a value with hash {recorded}",
        shown if len(shown) <= 160 else shown[:159] + "…",
    )


_CLEAN_EXITS = frozenset({"SystemExit", "SystemExit: ", "SystemExit: 0", "SystemExit: None"})
"""A run ending in ``sys.exit(0)`` / ``sys.exit()`` returned: the whole-process recording says ``returned`` for it,
``recording()`` says ``raised SystemExit: 0``, and a rerun of either ends in ``SystemExit: 0``."""


_DROPPED = re.compile(r" \(dropped \d+ event\(s\) it could not store\)\Z")
"""What a recording that lost events appends to its outcome (said in the report, not part of how it ended)."""
_RETURNED = frozenset({"", "returned", "raised builtins:SystemExit: 0", "raised builtins:SystemExit: None"})


def _as_stored(exc: BaseException) -> str:
    """The rerun's outcome as a recording stores its own (the final chunk redacts it once more)."""
    return redact(outcome_of(exc).encode("utf-8", "backslashreplace").decode("utf-8"))


def _same_outcome(recorded: str, error: str | None, ended: str, codec: int) -> bool:
    """Whether the rerun ended as the recorded run did, by the rules of the recording's ``codec``.

    From format 3, by what the outcome is: returned (``sys.exit(0)`` included), the exit status of a
    ``SystemExit``, or the exception's class by its import path and its redacted message. Older
    recordings stored only the class's name, and are compared by it.
    """
    if codec >= 3:
        recorded = _DROPPED.sub("", recorded)
        return (recorded in _RETURNED and ended in _RETURNED) or recorded == ended
    if recorded.removeprefix("raised ") in _CLEAN_EXITS:
        recorded = "returned"
    if error is None or error in _CLEAN_EXITS:
        return recorded in ("", "returned")
    return recorded.startswith("raised ") and recorded[len("raised ") :].split(":")[0] == error.split(":")[0]


def _gate(
    store: Store, result: RerunResult, live_state: Mapping[str, Any], policy: Policy, rail: Any
) -> list[GateResult]:
    outcomes = []
    for original_id, _ in result.decisions:
        try:
            record = store.record(original_id)
            if record.action is None or record.snapshot is None:
                continue
            verdict = judge_stored(store, record, live_state=live_state, policy=policy)  # its commits' actions too
        except (OtelReplayError, ValueError) as exc:
            outcomes.append(GateResult(original_id, "error", "", (), _one_line(exc)))
            continue
        if rail is None:
            outcomes.append(GateResult(original_id, verdict.fix.value, verdict.reason))
            continue
        try:
            executed = execute_verdict(store, verdict, rail)
            outcomes.append(
                GateResult(original_id, verdict.fix.value, verdict.reason, tuple(o.executed for o in executed))
            )
        except Exception as exc:  # noqa: BLE001 - a rail's own refusal too: recorded, and the next decision still gated
            notes = "; ".join(str(note) for note in getattr(exc, "__notes__", ()))  # what happened to every receipt
            error = _one_line(exc) + (f" ({notes[:1000]})" if notes else "")
            outcomes.append(GateResult(original_id, verdict.fix.value, verdict.reason, (), error))
    return outcomes


def _write(result: RerunResult) -> None:
    attrs: dict[str, Any] = {
        sc.KIND: sc.KIND_RERUN,
        sc.RECORD_SOURCE: "rerun",
        sc.RERUN_ID: result.rerun_id,
        sc.RERUN_OF: result.session_id,
        sc.SESSION_ID: f"{result.session_id}~rerun~{result.rerun_id}",
        sc.RERUN_GOVERNANCE: result.governance,
        sc.RERUN_MATCHED: result.matched,
        sc.RERUN_FINGERPRINT: result.fingerprint,
        sc.RERUN_ORIGINAL_FINGERPRINT: result.original_fingerprint or "",
        sc.RERUN_STEPS: result.steps,
        sc.RERUN_VERDICTS: canonical_json([g.to_json() for g in result.gate], where="rerun verdicts"),
    }
    if result.divergence is not None:
        attrs[sc.RERUN_DIVERGENCE] = canonical_json(result.divergence.to_json(), where="rerun divergence")
    attrs[sc.RECORD_ID] = result.rerun_id
    get_recorder().emit(sc.SPAN_RERUN, result.rerun_id, attrs)
