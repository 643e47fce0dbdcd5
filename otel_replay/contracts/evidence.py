"""Evidence: one ``replay.contract.decision`` span per enforcement decision, redacted, or none at all.

The span goes to the global tracer provider, so the dataset ``configure()`` set up stores it beside the
model and tool spans of the same session (``replay.session_id``). It holds the tool names, the tool
calls' arguments (redacted by :mod:`otel_replay.redaction`: API keys, bearer tokens, PEM keys,
connection strings, e-mail addresses, card numbers, values under secret names), the verdict and its
failures, the phases before and after and the state version. Never the prompt or any message text.

If redaction fails on anything the span would hold, no span is written: :attr:`Evidence.dropped` counts
it and the session's ``diagnostics`` callback is told.

Every decision is also reported to the seam mode in force (a recording or a rerun), whatever the capture
level, as audit() reports its decisions: its ``contract_verdict`` method gets :func:`verdict_text`, the part of
the decision a rerun must reproduce. A recording keeps it as an ordered event; a rerun compares it with the
recorded one at the same place, so a rerun under changed contracts names the first decision that differs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from opentelemetry import trace
from opentelemetry.trace import SpanKind, TracerProvider

from otel_replay import _seam
from otel_replay import semconv as sc
from otel_replay.contracts.engine import Decision, Failure, ToolCallView
from otel_replay.redaction import redact, redact_value

__all__ = [
    "MAX_ARGUMENT_CHARS",
    "MAX_TOOLS",
    "MAX_VERDICT_CHARS",
    "DecisionEvidence",
    "Evidence",
    "failure_json",
    "verdict_text",
]

_log = logging.getLogger("otel_replay.contracts")

MAX_TOOLS: Final = 256
"""Tool calls listed on one span; the rest are counted (``replay.contract.tools.dropped``)."""
MAX_ARGUMENT_CHARS: Final = 4096
"""A tool call's redacted arguments are cut to this many characters on the span (with a marker)."""
MAX_VERDICT_CHARS: Final = 16_384
"""A verdict text longer than this (thousands of tool calls, huge tool names) is reported cut, with the SHA-256
of the whole (see :func:`verdict_text`): still compared in full, stored bounded."""

_SCOPE: Final = "otel_replay.contracts"
_VERSION: Final = "0.1.0"


@dataclass(frozen=True)
class DecisionEvidence:
    """What one decision's span says (everything but the session's identity)."""

    mode: str
    provider: str
    api: str
    streamed: bool
    outcome: str
    step: int
    state_version: int
    phase_before: str | None
    phase_after: str | None
    calls: Sequence[ToolCallView]
    allowed: Mapping[int, bool]
    """Call index -> allowed (log-only: every call, unchecked, ``True``)."""
    failures: Sequence[Failure]
    narrowed: Sequence[str]
    precheck: Sequence[Failure] = ()
    """The session limits that stopped (enforce) or would have stopped (shadow) the model call before it was made."""


def failure_json(failure: Failure) -> dict[str, Any]:
    """A failure as the span (and a shadow delta) lists it; its detail redacted."""
    return {
        "rule": failure.rule,
        "tool": failure.tool,
        "call_id": failure.call_id,
        "path": failure.path,
        "detail": redact(failure.detail, personal=True),
        "source": str(failure.source) if failure.source is not None else None,
    }


def _rule(failure: Failure) -> dict[str, Any]:
    """What of a failure decides a verdict: its rule, tool and argument path (not its wording or source line)."""
    return {"rule": failure.rule, "tool": failure.tool, "path": failure.path}


def _odd(value: Any) -> str:
    """A value JSON has no form for (a tool name that is not text): named by its type, the same in every run."""
    return f"<{type(value).__name__}>"


def verdict_text(evidence: DecisionEvidence) -> str:
    """The canonical JSON of what decides one verdict, the same in a rerun of the same run under the same contracts.

    The mode, the outcome, the phase before and after, each tool call's name and whether it reached the
    caller, each failure's rule, tool and path, the pre-check failures and the tools narrowing removed.
    Never ids, times, step numbers, state versions or the contracts' digest: those differ between runs by
    design, and what a rerun compares is the verdict. Tool names come from model output: the text is ASCII
    (anything else escaped), and one over :data:`MAX_VERDICT_CHARS` (thousands of calls, huge names) lists
    only the first :data:`_CUT_ITEMS` entries of each list, names cut, with the counts and the SHA-256 of the
    whole verdict, so a difference anywhere in it still counts.
    """
    verdict: dict[str, Any] = {
        "mode": evidence.mode,
        "outcome": evidence.outcome,
        "phase_before": evidence.phase_before,
        "phase_after": evidence.phase_after,
        "calls": [{"name": call.name, "allowed": evidence.allowed.get(call.index, False)} for call in evidence.calls],
        "failures": [_rule(failure) for failure in evidence.failures],
        "precheck": [_rule(failure) for failure in evidence.precheck],
        "narrowed": list(evidence.narrowed),
    }
    text = _canonical(verdict)
    if len(text) <= MAX_VERDICT_CHARS:
        return text
    cut = {key: _cut(value) for key, value in verdict.items()}
    lists = ("calls", "failures", "precheck", "narrowed")
    cut["cut"] = {**{key: len(verdict[key]) for key in lists}, "sha256": hashlib.sha256(text.encode()).hexdigest()}
    return _canonical(cut)


_CUT_ITEMS: Final = 32
_CUT_NAME: Final = 120


def _cut(value: Any) -> Any:
    """``value`` as a cut verdict lists it: the first :data:`_CUT_ITEMS` entries of a list, texts cut."""
    if isinstance(value, list):
        return [_cut(item) for item in value[:_CUT_ITEMS]]
    if isinstance(value, dict):
        return {key: _cut(item) for key, item in value.items()}
    if isinstance(value, str) and len(value) > _CUT_NAME:
        return value[:_CUT_NAME] + "..."
    return value


def _canonical(value: Any) -> str:
    return _CANONICAL.encode(value)


# Encoders made once (``json.dumps`` with options builds one per call): what the span and the verdict hold.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=_odd)
_SORTED = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str)
_COMPACT = json.JSONEncoder(separators=(",", ":"))


def _arguments(call: ToolCallView) -> str:
    if call.arguments is not None:
        text = _SORTED.encode(redact_value(dict(call.arguments), personal=True))
    else:  # not a JSON object: the text itself, redacted
        text = redact(call.arguments_text[: 4 * MAX_ARGUMENT_CHARS], personal=True)
    if len(text) > MAX_ARGUMENT_CHARS:
        text = text[:MAX_ARGUMENT_CHARS] + f"...[cut {len(text) - MAX_ARGUMENT_CHARS} chars]"
    return text


def _text(value: Any) -> str:
    """A call's id or name as text (a list or a number cut to 200 characters of its ``repr``).

    The clients do not validate them, and a response whose call is named by a list still gets its span.
    """
    return value if isinstance(value, str) else repr(value)[:200]


def attributes_of(evidence: DecisionEvidence, *, session_id: str, agent: str | None, digest: str) -> dict[str, Any]:
    """The span attributes of one decision (raises if redaction fails: the caller drops the span)."""
    tools = [
        {
            "call_id": redact(_text(call.call_id), personal=True),  # the model writes ids and names too
            "name": redact(_text(call.name), personal=True),
            "allowed": evidence.allowed.get(call.index, False),
            "arguments": _arguments(call),
        }
        for call in evidence.calls[:MAX_TOOLS]
    ]
    attrs: dict[str, Any] = {
        sc.SESSION_ID: session_id,
        sc.CONTRACT_SESSION_ID: session_id,
        sc.CONTRACT_STEP: evidence.step,
        sc.CONTRACT_MODE: evidence.mode,
        sc.CONTRACT_OUTCOME: evidence.outcome,
        sc.CONTRACT_STATE_VERSION: evidence.state_version,
        sc.CONTRACT_DIGEST: digest,
        sc.CONTRACT_PROVIDER: evidence.provider,
        sc.CONTRACT_API: evidence.api,
        sc.CONTRACT_STREAMED: evidence.streamed,
        sc.CONTRACT_TOOLS: _COMPACT.encode(tools),
        sc.CONTRACT_FAILURES: _COMPACT.encode([failure_json(f) for f in evidence.failures]),
        sc.CONTRACT_NARROWED: _COMPACT.encode(list(evidence.narrowed)),
    }
    if agent is not None:
        attrs[sc.CONTRACT_AGENT] = agent
        attrs[sc.AGENT_ID] = agent
    if evidence.phase_before is not None:
        attrs[sc.CONTRACT_PHASE_BEFORE] = evidence.phase_before
    if evidence.phase_after is not None:
        attrs[sc.CONTRACT_PHASE_AFTER] = evidence.phase_after
    if len(evidence.calls) > MAX_TOOLS:
        attrs[sc.CONTRACT_TOOLS_DROPPED] = len(evidence.calls) - MAX_TOOLS
    return attrs


def of_decision(
    decision: Decision,
    calls: Sequence[ToolCallView],
    *,
    mode: str,
    provider: str,
    api: str,
    streamed: bool,
    narrowed: Sequence[str],
    precheck: Sequence[Failure] = (),
) -> DecisionEvidence:
    """The evidence of an engine decision (``precheck``: the limits shadow mode found before the model call)."""
    delivered = {verdict.call.index for verdict in decision.allowed}  # none under "reject"
    allowed = {call.index: call.index in delivered for call in calls}
    return DecisionEvidence(
        mode=mode,
        provider=provider,
        api=api,
        streamed=streamed,
        outcome=decision.outcome,
        step=decision.step,
        state_version=decision.state_version,
        phase_before=decision.phase_before,
        phase_after=decision.phase_after,
        calls=calls,
        allowed=allowed,
        failures=decision.failures,
        narrowed=narrowed,
        precheck=precheck,
    )


class Evidence:
    """Writes one session's decision spans; counts what it wrote and what it dropped."""

    def __init__(
        self,
        session_id: str,
        agent: str | None,
        digest: str,
        diagnostics: Callable[[dict[str, Any]], None],
        *,
        enabled: bool = True,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        """Evidence for session ``session_id`` under the contracts with ``digest`` (``enabled=False``: none).

        The spans go to ``tracer_provider`` (default: the global one, as ``configure()`` sets it).
        """
        self.enabled = enabled
        self.tracer_provider = tracer_provider
        self._tracer = trace.get_tracer(_SCOPE, _VERSION, tracer_provider)
        self.session_id = session_id
        self.agent = agent
        self.digest = digest
        self._diagnostics = diagnostics
        self._lock = threading.Lock()
        self.emitted = 0
        """Spans written."""
        self.dropped = 0
        """Spans not written because redaction (or building the span) failed."""

    def emit(self, evidence: DecisionEvidence) -> bool:
        """Report one decision to the recording or rerun in force, then write its span.

        Returns ``False`` when no span was written (capture is off, or it had to be dropped: counted). A strict
        rerun whose verdict differs from the recorded one raises its ``ReplayMismatchError`` from here.
        """
        hook = getattr(_seam.current(), "contract_verdict", None)
        if hook is not None:
            hook(verdict_text(evidence))
        if not self.enabled:
            return False
        try:
            attrs = attributes_of(evidence, session_id=self.session_id, agent=self.agent, digest=self.digest)
        except Exception as exc:  # noqa: BLE001 - fail closed: no span rather than an unredacted one
            with self._lock:
                self.dropped += 1
            _log.warning("otel-replay: a contract decision span was dropped: redaction failed (%s)", type(exc).__name__)
            self._diagnostics({"event": "evidence_dropped", "step": evidence.step, "error": type(exc).__name__})
            return False
        span = self._tracer.start_span(sc.SPAN_CONTRACT_DECISION, kind=SpanKind.INTERNAL, attributes=attrs)
        span.end()
        with self._lock:
            self.emitted += 1
        return True
