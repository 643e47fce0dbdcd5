"""``govern()``: wrap an OpenAI or Anthropic client so its tool calls obey a contracts directory.

::

    session = otel_replay.govern(OpenAI(), contracts_dir="contracts", agent="refund-bot")
    response = session.client.chat.completions.create(model=..., messages=..., tools=all_tools)

``session.client`` behaves exactly like the client for what the contracts allow. Per call: the tool results
the request carries back are recorded (``with_output``), the session limits are checked, the request's
``tools`` list is narrowed to what is valid now, the model is called, each tool call of the response is
validated, the gate mode decides (raise, strip, or pass), the session state advances, and one redacted
``replay.contract.decision`` span records the decision. See :mod:`otel_replay.contracts.pipeline`.

A call made on the ORIGINAL client while a session wraps it is not governed; it is seen (its request goes
through the same client) and reported by :meth:`GovernedSession.get_health` as ``bypass_detected``.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from opentelemetry import trace
from opentelemetry.trace import TracerProvider

from otel_replay import _seam
from otel_replay.capture.recorder import get_recorder
from otel_replay.contracts.engine import Decision, Engine, Narrowing
from otel_replay.contracts.evidence import Evidence
from otel_replay.contracts.loader import load_contracts
from otel_replay.contracts.model import ContractSet
from otel_replay.contracts.pipeline import GOVERNED, Governor, ShadowDelta
from otel_replay.contracts.providers.base import detect
from otel_replay.contracts.providers.clients import governed_client
from otel_replay.contracts.store import FileStateStore, MemoryStateStore, StateStore
from otel_replay.contracts.tools import SessionTools, prepare_executors
from otel_replay.errors import ContractError

__all__ = ["CAPTURE_LEVELS", "GovernedSession", "govern"]

CAPTURE_LEVELS: Final = ("redacted", "none")
"""``redacted``: one redacted decision span per decision; ``none``: no decision spans. Prompts are never captured."""

_HOOK: Final = "_otel_replay_session"


class GovernedSession:
    """One governed agent session: the governed client, the session's tools, its state and controls."""

    def __init__(
        self,
        client: Any,
        governor: Governor,
        *,
        provider: str,
        aio: bool,
        contracts: ContractSet,
        executors: Mapping[str, Callable[..., Any]],
        max_retries: int,
        principal: Any,
        owns_store: bool = False,
    ) -> None:
        """Use :func:`govern`."""
        self.original = client
        """The client as given (calls on it bypass the session, and are reported)."""
        self.governor = governor
        self.contracts = contracts
        self.provider = provider
        self.max_retries = max_retries
        self._principal = principal  # kept for the application; never in the state, a span or a log
        self._owns_store = owns_store
        self._active = True
        self._bypass_calls = 0
        self._lock = threading.Lock()
        self.client: Any = governed_client(client, self, provider, aio)
        """The governed client: use it for every call."""
        self.tools = SessionTools(executors, governor)
        """The governed tool executors (``govern(tools=...)``)."""
        self._hook(client, aio)

    # --- identity ----------------------------------------------------------------------------------------

    @property
    def session_id(self) -> str:
        """The session's id (the evidence spans carry it as ``replay.session_id``)."""
        return self.governor.session_id

    @property
    def active(self) -> bool:
        """``False`` after :meth:`restore`: the client then passes every call through unchecked."""
        return self._active

    @property
    def mode(self) -> str:
        """``enforce``, ``shadow`` or ``log-only``."""
        return self.governor.mode

    # --- bypass detection --------------------------------------------------------------------------------

    def _hook(self, client: Any, aio: bool) -> None:
        """Watch the client's own ``request`` method: a request not made by a governed call is a bypass."""
        existing = getattr(client, "__dict__", {}).get("request")
        if existing is not None and getattr(existing, _HOOK, None) is not None:
            raise ContractError(
                "govern(): this client is already governed by another session: create one client per session"
            )
        original = client.request
        session = self

        if aio:

            async def request(*args: Any, **kwargs: Any) -> Any:
                if not GOVERNED.get() and session._active and _generates(args, kwargs):
                    session._bypassed()
                return await original(*args, **kwargs)

            hook: Callable[..., Any] = request
        else:

            def request(*args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
                if not GOVERNED.get() and session._active and _generates(args, kwargs):
                    session._bypassed()
                return original(*args, **kwargs)

            hook = request
        setattr(hook, _HOOK, self.session_id)
        try:
            client.request = hook
        except (AttributeError, TypeError):  # a client that takes no instance attributes: no bypass detection
            self.governor.tell({"event": "bypass_detection_unavailable", "client": type(client).__name__})

    def watch(self, client: Any, aio: bool) -> None:
        """Watch ``client`` (a copy of the governed client: ``session.client.copy()``) for bypasses too."""
        self._hook(client, aio)

    def _bypassed(self) -> None:
        with self._lock:
            self._bypass_calls += 1
            first = self._bypass_calls == 1
        if first:
            self.governor.tell({"event": "bypass_detected", "session_id": self.session_id})

    # --- controls ----------------------------------------------------------------------------------------

    def kill(self, reason: str = "killed by kill()") -> None:
        """Kill the session: every later call of the governed client raises :class:`ReplayKillError`.

        Stored with the session state, so another process (or a restart) using the same store sees it.
        """
        self.governor.update(lambda state: self.governor.engine.kill(state, reason))

    def restore(self) -> None:
        """Stop governing: the original client is unwatched and ``session.client`` passes calls through."""
        self._active = False
        hooked = getattr(self.original, "__dict__", {}).get("request")
        if hooked is not None and getattr(hooked, _HOOK, None) == self.session_id:
            del self.original.__dict__["request"]
        close = getattr(self.governor.store, "close", None)
        if self._owns_store and close is not None:  # the dataset's file store govern() opened: released
            close()

    def narrow(self, names: Sequence[str]) -> None:
        """Narrow the session to ``names`` on top of every contract rule (``control_revision`` +1)."""
        if isinstance(names, str) or not all(isinstance(name, str) for name in names):
            raise ContractError("narrow(): give a list of tool names")
        self.governor.update(lambda state: self.governor.engine.restrict(state, list(names)))

    def widen(self) -> None:
        """Undo :meth:`narrow` (``control_revision`` +1)."""
        self.governor.update(self.governor.engine.widen)

    # --- reports -----------------------------------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        """The session state, JSON-ready and redacted (the principal always ``None``, output values hidden)."""
        return self.governor.state().public()

    @property
    def last_shadow_delta(self) -> ShadowDelta | None:
        """What enforcing would have done with the last response (shadow mode; ``None`` otherwise or before it)."""
        return self.governor.last_shadow_delta

    def get_health(self) -> dict[str, Any]:
        """How the session is doing (no state values beyond counts)."""
        state = self.governor.state()
        mode = self.governor.mode
        bypass = self._bypass_calls > 0
        evidence = self.governor.evidence
        if not self._active:
            status = "inactive"
        elif bypass or state.total_unguarded_calls or evidence.dropped or self.governor.callback_errors:
            status = "degraded"
        else:
            status = "healthy"
        if mode != "enforce":
            level = "monitor"
        else:
            bearing = {name for name, contract in self.contracts.tools.items() if contract.state_bearing}
            level = "govern" if bearing and bearing <= set(self.tools) else "protect"
        return {
            "status": status,
            "mode": mode,
            "protection_level": level,
            "durability": "file" if isinstance(self.governor.store, FileStateStore) else "memory",
            "killed": state.killed,
            "bypass_detected": bypass,
            "bypass_calls": self._bypass_calls,
            "total_steps": state.total_step_count,
            "total_blocks": state.total_block_count,
            "total_errors": state.total_error_count,
            "total_unguarded_calls": state.total_unguarded_calls,
            "shadow_evaluations": self.governor.shadow_evaluations,
            "evidence_spans": evidence.emitted,
            "evidence_dropped": evidence.dropped,
            "callback_errors": self.governor.callback_errors,
        }

    def flush(self, timeout_millis: int = 30_000) -> bool:
        """Flush the decision spans' tracer provider (so they reach the dataset); ``False`` on time-out."""
        provider = self.governor.evidence.tracer_provider or trace.get_tracer_provider()
        flush = getattr(provider, "force_flush", None)
        return bool(flush(timeout_millis)) if flush is not None else True


_GENERATING: Final = frozenset({"/chat/completions", "/responses", "/messages", "/completions"})
"""The endpoints that make a model generate (and so propose tool calls): a request to one of them that no
governed call made is a bypass. Others (listing models, counting tokens, retrieving a response) are not."""


def _generates(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a client ``request(cast_to, options, ...)`` asks a model to generate (unknown: assume it does)."""
    options = args[1] if len(args) > 1 else kwargs.get("options")
    url = getattr(options, "url", None)
    method = getattr(options, "method", None)
    if not isinstance(url, str) or not isinstance(method, str):
        return True
    path = url.split("?", 1)[0].rstrip("/")
    return method.lower() == "post" and any(path.endswith(end) for end in _GENERATING)


def _default_store() -> StateStore:
    """The configured dataset's file store (``<dataset>/_governance/sessions.sqlite3``), else one in memory.

    In memory during a rerun: a rerun starts from a fresh state, never the one the recorded run left in the
    dataset (which it neither reads nor writes).
    """
    if getattr(_seam.current(), "rerunning", False) is True:
        return MemoryStateStore()
    dataset = getattr(get_recorder(), "dataset", None)
    if isinstance(dataset, str | os.PathLike) and str(dataset):
        return FileStateStore.for_dataset(dataset)
    return MemoryStateStore()


def _contracts(contracts_dir: Any) -> ContractSet:
    if isinstance(contracts_dir, ContractSet):
        return contracts_dir
    if not isinstance(contracts_dir, str | os.PathLike):
        raise ContractError(f"govern(): contracts_dir must be a directory path, got {type(contracts_dir).__name__}")
    return load_contracts(Path(contracts_dir))


def govern(
    client: Any,
    contracts_dir: str | os.PathLike[str] | ContractSet,
    *,
    agent: str | None = None,
    session_id: str | None = None,
    principal: Any = None,
    mode: str = "enforce",
    gate: str = "reject_all",
    on_error: str = "block",
    unmatched_policy: str = "block",
    tools: Mapping[str, Callable[..., Any]] | None = None,
    store: StateStore | None = None,
    on_block: Callable[[Decision], Any] | None = None,
    on_narrow: Callable[[Narrowing], Any] | None = None,
    diagnostics: Callable[[dict[str, Any]], Any] | None = None,
    max_retries: int = 0,
    max_unguarded_calls: int | None = None,
    capture_level: str = "redacted",
    tracer_provider: TracerProvider | None = None,
) -> GovernedSession:
    """Govern ``client`` (an ``openai`` or ``anthropic`` client, sync or async) with a contracts directory.

    Args:
        client: the client; one session per client (a second ``govern`` of the same client is refused).
        contracts_dir: the directory of tool YAML files and ``session.yaml`` (or a loaded ``ContractSet``).
        agent: the agent's name (default: ``session.yaml``'s ``agent``).
        session_id: resume (or name) this session; default a new id.
        principal: the caller's identity, kept for the application, never stored, logged or shown.
        mode: ``enforce`` (block), ``shadow`` (evaluate only: never blocks, never changes the state; see
            ``last_shadow_delta``) or ``log-only`` (record the tool calls, check nothing).
        gate: ``reject_all`` (any failing call raises ``ReplayContractError``), ``strip_partial`` (failing
            calls removed; raise when all fail) or ``strip_blocked`` (failing calls removed; text only when all fail).
        on_error: an internal error while governing a call: ``block`` refuses it, ``allow`` lets it through,
            counted in ``total_unguarded_calls``.
        unmatched_policy: a call of a tool with no contract: ``block`` or ``allow``.
        tools: the tool executors, by name (see :mod:`otel_replay.contracts.tools`): ``session.tools``.
        store: where the session state lives (default: the configured local dataset's
            ``_governance/sessions.sqlite3``, else memory; always memory during a rerun, which starts from
            a fresh state and never reads or writes the recorded run's); a restarted process resumes from it.
        on_block: called with each decision that blocked or stripped a call.
        on_narrow: called with each narrowing that removed a tool from a request.
        diagnostics: called with events (``bypass_detected``, ``evidence_dropped``, ``unguarded_call``, ...).
        max_retries: a rejected response is asked for again up to this many times (0 to 5) before raising.
        max_unguarded_calls: kill the session once this many calls went through unchecked.
        capture_level: ``redacted`` (decision spans, redacted) or ``none`` (no decision spans).
        tracer_provider: where the decision spans go (default: the global provider ``configure()`` installs).

    Raises:
        ContractError: an unsupported client, a bad option; ContractLoadError: a bad contracts directory.

    """
    provider, aio = detect(client)
    contracts = _contracts(contracts_dir)
    if not isinstance(max_retries, int) or isinstance(max_retries, bool) or not 0 <= max_retries <= 5:
        raise ContractError(f"govern(): max_retries={max_retries!r}: expected an integer from 0 to 5")
    if max_unguarded_calls is not None and (
        not isinstance(max_unguarded_calls, int) or isinstance(max_unguarded_calls, bool) or max_unguarded_calls < 1
    ):
        raise ContractError(f"govern(): max_unguarded_calls={max_unguarded_calls!r}: expected a positive integer")
    if capture_level not in CAPTURE_LEVELS:
        raise ContractError(f"govern(): capture_level={capture_level!r}: expected one of {', '.join(CAPTURE_LEVELS)}")
    if session_id is not None and (not isinstance(session_id, str) or not session_id.strip()):
        raise ContractError(f"govern(): session_id={session_id!r}: expected a non-empty string")
    engine = Engine(contracts, gate=gate, unmatched_policy=unmatched_policy, on_error=on_error)
    executors = prepare_executors(contracts, tools or {})
    sid = session_id or uuid.uuid4().hex
    name = agent if agent is not None else contracts.session.agent
    governor_box: list[Governor] = []

    def tell(event: dict[str, Any]) -> None:
        if governor_box:
            governor_box[0].tell(event)

    evidence = Evidence(
        sid, name, contracts.digest, tell, enabled=capture_level != "none", tracer_provider=tracer_provider
    )
    governor = Governor(
        engine,
        store if store is not None else _default_store(),
        session_id=sid,
        agent=name,
        mode=mode,
        evidence=evidence,
        on_block=on_block,
        on_narrow=on_narrow,
        diagnostics=diagnostics,
        max_unguarded_calls=max_unguarded_calls,
    )
    governor_box.append(governor)
    return GovernedSession(
        client,
        governor,
        provider=provider,
        aio=aio,
        contracts=contracts,
        executors=executors,
        max_retries=max_retries,
        principal=principal,
        owns_store=store is None,
    )
