"""Agent tools as ``execute_tool {name}`` spans: the :func:`tool` decorator and :func:`wrap_tool`.

A tool call is an INTERNAL span named ``execute_tool {name}`` with
``gen_ai.operation.name = execute_tool``, ``gen_ai.tool.name`` / ``.type`` /
``.description`` and ``replay.kind = tool``; inside ``audit()`` it is a child of
the decision and carries its record id (so it shows in the ``acts`` view).
When a model response asked for this very call (same tool name and
arguments), the span takes the model's ``gen_ai.tool.call.id`` and a link to
the model span. Arguments and result are recorded only with content capture
on, redacted. An exception marks the span ERROR and is re-raised unchanged.

A tool declared with a gate (``@tool(side_effect="financial", gate=gate)``)
is a decision of its own: each call opens ``audit(name, snapshot=...)``, runs
the function, which returns the :class:`~otel_replay.records.Action` to take,
records it as the decision's act and commits it through the gate's rail
(``gate.commit(action, record_id=...)``), and returns the rail's receipt. The
tool call, the act and the gate outcome are linked in one sealed decision
record, which :func:`otel_replay.replay` and ``otel-replay replay`` replay
like any other.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, overload

import wrapt
from opentelemetry import context
from opentelemetry.trace import Link, SpanKind, Tracer, TracerProvider

from otel_replay import semconv as sc
from otel_replay._seam import Call, current_codec, through, through_async
from otel_replay.capture.audit import audit, current_decision
from otel_replay.errors import CaptureError
from otel_replay.instrumentation import _toolcalls
from otel_replay.instrumentation._common import begin, content_enabled, end_failed, guard, scope_ids, tracer_for
from otel_replay.instrumentation._genai import write_content
from otel_replay.records import Action, DependencySnapshot

__all__ = ["tool", "unwrap_tool", "wrap_tool"]

F = TypeVar("F", bound=Callable[..., Any])

SnapshotSource = DependencySnapshot | Callable[[], DependencySnapshot] | None


def _enclosing_decision() -> Any:
    """The enclosing ``audit()`` decision a gated tool acts for, if it has not acted yet."""
    outer = current_decision()
    return outer if outer is not None and not outer.acted else None


class _Tool:
    """How one tool is observed (shared by the decorator and dotted-path wrapping)."""

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str,
        description: str | None,
        side_effect: str | None,
        gate: Any,
        snapshot: SnapshotSource,
        capture_content: bool | None,
        tracer_provider: TracerProvider | None,
    ) -> None:
        if gate is not None and not callable(getattr(gate, "commit", None)):
            raise CaptureError(f"tool {name!r}: gate must be an ActionGate (an object with commit()), got {gate!r}")
        if snapshot is not None and not (isinstance(snapshot, DependencySnapshot) or callable(snapshot)):
            raise CaptureError(f"tool {name!r}: snapshot must be a DependencySnapshot or a callable returning one")
        self.name = name
        self.gate = gate
        self.snapshot = snapshot
        self.capture = capture_content
        self.tracer: Tracer = tracer_for("tools", tracer_provider)
        try:
            self.signature: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):
            self.signature = None
        self.defaults: dict[str, Any] = (
            {n: p.default for n, p in self.signature.parameters.items() if p.default is not inspect.Parameter.empty}
            if self.signature is not None
            else {}
        )  # what a framework passes for a parameter the model left out (see _toolcalls.take)
        self.base: dict[str, Any] = {
            sc.KIND: sc.KIND_TOOL,
            sc.GEN_AI_OPERATION_NAME: sc.GEN_AI_OP_EXECUTE_TOOL,
            sc.GEN_AI_TOOL_NAME: name,
            sc.GEN_AI_TOOL_TYPE: "function",
        }
        if description:
            self.base[sc.GEN_AI_TOOL_DESCRIPTION] = description
        if side_effect:
            self.base[sc.TOOL_SIDE_EFFECT] = side_effect
        self.span_name = f"{sc.SPAN_EXECUTE_TOOL_PREFIX} {name}"

    # --- pieces ---------------------------------------------------------------------------------

    def arguments(self, args: tuple[Any, ...], kwargs: Mapping[str, Any], instance: Any = None) -> dict[str, Any]:
        """The call's arguments by parameter name (``self``/``cls`` left out: see :meth:`compared`)."""
        if self.signature is None:
            return {**{f"arg{i}": a for i, a in enumerate(args)}, **kwargs}
        first = next(iter(self.signature.parameters), None)
        receiver = first in ("self", "cls")
        try:
            # A method wrapped in place (wrap_tool) gets its instance apart: bound in its place, not shifted.
            given = (instance, *args) if instance is not None and receiver else args
            bound = self.signature.bind(*given, **kwargs)
        except TypeError:
            return {**{f"arg{i}": a for i, a in enumerate(args)}, **kwargs}
        named = dict(bound.arguments)  # as passed (defaults left out, as the model's tool call leaves them out)
        if instance is not None or receiver:
            named.pop("self", None)
            named.pop("cls", None)
        return named

    def compared(self, arguments: dict[str, Any], args: tuple[Any, ...], instance: Any = None) -> dict[str, Any]:
        """What a rerun compares of a call: its arguments and, from codec 3, the receiver of a method.

        From codec 4 the defaults of the parameters the call left out are compared too (see
        :meth:`with_defaults`): a tool whose ``currency="USD"`` became ``currency="EUR"`` acts differently.

        ``Account("treasury").pay(...)`` and ``Account("escrow").pay(...)`` are different actions: the
        receiver is compared by its value representation, like any argument, and one without any (a client,
        a lock) makes the call unmatchable. Not shown on the span, nor matched against the model's tool call.
        """
        codec = current_codec()
        if codec < 3:
            return arguments
        if codec >= 4:
            arguments = self.with_defaults(arguments)
        first = next(iter(self.signature.parameters), None) if self.signature is not None else None
        if instance is not None:
            return {first if first in ("self", "cls") else "self": instance, **arguments}
        if first in ("self", "cls") and args:
            return {first: args[0], **arguments}
        return arguments

    def with_defaults(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """``arguments`` with the default of each parameter the call left out (``*args``/``**kwargs`` excepted).

        A callable with no signature (a builtin, a C function) or arguments its signature could not bind
        (named ``arg0``, ...) are left as given. A default with no value representation makes the call
        unmatchable, as the same value passed would.
        """
        if self.signature is None or not set(arguments) <= set(self.signature.parameters):
            return arguments  # no signature, or one the call did not bind to (its arguments named by position)
        defaults = {
            name: parameter.default
            for name, parameter in self.signature.parameters.items()
            if parameter.default is not inspect.Parameter.empty
            and parameter.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
            and name not in arguments
            and name not in ("self", "cls")
        }
        return {**arguments, **defaults} if defaults else arguments

    def snapshot_now(self) -> DependencySnapshot:
        source = self.snapshot
        if source is None:
            return DependencySnapshot({}, version="unspecified")
        snap = source if isinstance(source, DependencySnapshot) else source()
        if not isinstance(snap, DependencySnapshot):
            kind = type(snap).__name__
            raise CaptureError(f"tool {self.name!r}: snapshot() returned {kind}, not a DependencySnapshot")
        return snap

    def start(self, arguments: dict[str, Any], capture: bool) -> tuple[Any, Any] | None:
        attrs = dict(self.base)
        scope_ids(attrs)
        links: list[Link] = []
        asked = _toolcalls.take(self.name, arguments, self.defaults) if _toolcalls._calls else None
        if asked is not None:
            attrs[sc.GEN_AI_TOOL_CALL_ID] = asked[0]
            links.append(Link(asked[1]))
        started = begin(self.tracer, self.span_name, SpanKind.INTERNAL, attrs, model_layer=False, links=links)
        if started is not None and capture:
            guard("tool arguments", write_content, started[0], sc.GEN_AI_TOOL_CALL_ARGUMENTS, arguments)
        return started

    def action_of(self, result: Any) -> Action:
        if not isinstance(result, Action):
            raise CaptureError(
                f"tool {self.name!r} is gated: it must return the Action to commit, got {type(result).__name__}"
            )
        return result

    # --- sync -----------------------------------------------------------------------------------

    def run(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], instance: Any = None) -> Any:
        arguments = guard("tool arguments", self.arguments, args, kwargs, instance) or {}
        compared = self.compared(arguments, args, instance)
        if self.gate is not None:
            outer = _enclosing_decision()
            if outer is not None:
                return self._observed(fn, args, kwargs, arguments, outer, compared)
            with audit(self.name, snapshot=self.snapshot_now()) as decision:
                return self._observed(fn, args, kwargs, arguments, decision, compared)
        return self._observed(fn, args, kwargs, arguments, None, compared)

    def _observed(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        arguments: dict[str, Any],
        decision: Any,
        compared: dict[str, Any],
    ) -> Any:
        capture = content_enabled(self.capture)
        started = guard("tool span start", self.start, arguments, capture)
        try:
            result = through(Call("tool", self.name, compared), lambda: fn(*args, **kwargs))
            if decision is not None:
                result = self._commit(decision, self.action_of(result))
        except BaseException as exc:
            end_failed(started, exc, capture)
            raise
        return _finished(started, capture, result)

    def _commit(self, decision: Any, action: Action) -> Any:
        decision.act(action)
        gate = self.gate
        record_id = decision.record_id
        return through(
            Call("tool", f"{self.name}:commit", action.to_json()),
            lambda: gate.commit(action, record_id=record_id),
        )

    # --- async ----------------------------------------------------------------------------------

    async def arun(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], instance: Any = None
    ) -> Any:
        arguments = guard("tool arguments", self.arguments, args, kwargs, instance) or {}
        compared = self.compared(arguments, args, instance)
        if self.gate is not None:
            outer = _enclosing_decision()
            if outer is not None:
                return await self._aobserved(fn, args, kwargs, arguments, outer, compared)
            with audit(self.name, snapshot=self.snapshot_now()) as decision:
                return await self._aobserved(fn, args, kwargs, arguments, decision, compared)
        return await self._aobserved(fn, args, kwargs, arguments, None, compared)

    async def _aobserved(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        arguments: dict[str, Any],
        decision: Any,
        compared: dict[str, Any],
    ) -> Any:
        capture = content_enabled(self.capture)
        started = guard("tool span start", self.start, arguments, capture)
        try:
            result = await through_async(Call("tool", self.name, compared), lambda: fn(*args, **kwargs))
            if decision is not None:
                result = self._commit(decision, self.action_of(result))
        except BaseException as exc:
            end_failed(started, exc, capture)
            raise
        return _finished(started, capture, result)


def _finished(started: tuple[Any, Any] | None, capture: bool, result: Any) -> Any:
    """The tool returned: its span (if one started) gets the result (with capture on) and ends."""
    if started is not None:
        context.detach(started[1])
        if capture:
            guard("tool result", write_content, started[0], sc.GEN_AI_TOOL_CALL_RESULT, result)
        started[0].end()
    return result


def _make(
    fn: Callable[..., Any],
    name: str | None,
    description: str | None,
    side_effect: str | None,
    gate: Any,
    snapshot: SnapshotSource,
    capture_content: bool | None,
    tracer_provider: TracerProvider | None,
) -> _Tool:
    doc = (inspect.getdoc(fn) or "").strip().split("\n\n")[0] or None
    return _Tool(
        fn,
        name or str(getattr(fn, "__name__", "tool")),
        description if description is not None else doc,
        side_effect,
        gate,
        snapshot,
        capture_content,
        tracer_provider,
    )


@overload
def tool(fn: F, /) -> F: ...


@overload
def tool(
    name: str | None = None,
    /,
    *,
    description: str | None = None,
    side_effect: str | None = None,
    gate: Any = None,
    snapshot: SnapshotSource = None,
    capture_content: bool | None = None,
    tracer_provider: TracerProvider | None = None,
) -> Callable[[F], F]: ...


def tool(
    fn_or_name: Any = None,
    /,
    *,
    description: str | None = None,
    side_effect: str | None = None,
    gate: Any = None,
    snapshot: SnapshotSource = None,
    capture_content: bool | None = None,
    tracer_provider: TracerProvider | None = None,
) -> Any:
    """Declare an agent tool: each call becomes an ``execute_tool {name}`` span.

    Use bare (``@tool``), or with options (``@tool("lookup", side_effect="read")``).

    Args:
        fn_or_name: the function (bare use) or the tool's name (default: the function's name).
        description: ``gen_ai.tool.description`` (default: the docstring's first paragraph).
        side_effect: what the tool does to the world, e.g. ``"read"``, ``"write"``, ``"financial"``
            (``replay.tool.side_effect``).
        gate: an :class:`~otel_replay.gate.ActionGate`. The function then returns the
            :class:`~otel_replay.records.Action` to take; each call is a decision of its own,
            committed through the gate's rail, and the call returns the rail's receipt.
        snapshot: the :class:`~otel_replay.records.DependencySnapshot` a gated call relies on,
            or a callable returning it at call time (replay compares it with live state).
        capture_content: record arguments and result (default:
            ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``); redacted.
        tracer_provider: where the spans go (default: the global provider).

    Works on plain and ``async def`` functions and methods.

    """
    options = (description, side_effect, gate, snapshot, capture_content, tracer_provider)

    def decorate(fn: F) -> F:
        name = fn_or_name if isinstance(fn_or_name, str) else None
        spec = _make(fn, name, *options)
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_call(*args: Any, **kwargs: Any) -> Any:
                return await spec.arun(fn, args, kwargs)

            async_call.__otel_replay_tool__ = spec  # type: ignore[attr-defined]
            return async_call  # type: ignore[return-value]

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            return spec.run(fn, args, kwargs)

        call.__otel_replay_tool__ = spec  # type: ignore[attr-defined]
        return call  # type: ignore[return-value]

    if callable(fn_or_name) and not isinstance(fn_or_name, str):
        return decorate(fn_or_name)
    return decorate


def _import_longest(path: str) -> tuple[Any, str, list[str]]:
    """Import the longest importable module prefix of a dotted path; (module, its name, the rest)."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        name = ".".join(parts[:cut])
        try:
            return importlib.import_module(name), name, parts[cut:]
        except ModuleNotFoundError as exc:
            if exc.name is not None and not name.startswith(exc.name):
                raise CaptureError(f"wrap_tool({path!r}): importing {name!r} failed: {exc}") from None
    raise CaptureError(f"wrap_tool({path!r}): cannot import {parts[0]!r}")


def _resolve(path: str) -> tuple[Any, str]:
    """``"pkg.mod:Class.method"`` or ``"pkg.mod.Class.method"`` -> (owner object, attribute name)."""
    if ":" in path:
        module_name, _, qualname = path.partition(":")
        if not module_name or not qualname:
            raise CaptureError(f"wrap_tool({path!r}): give 'package.module:function' or 'package.module.function'")
        try:
            owner: Any = importlib.import_module(module_name)
        except ImportError as exc:
            raise CaptureError(f"wrap_tool({path!r}): cannot import {module_name!r}: {exc}") from None
        rest = qualname.split(".")
    else:
        if "." not in path:
            raise CaptureError(f"wrap_tool({path!r}): give a dotted path, 'package.module:function' or 'module.fn'")
        owner, module_name, rest = _import_longest(path)
    *parents, attr = rest
    for part in parents:
        try:
            owner = getattr(owner, part)
        except AttributeError:
            raise CaptureError(f"wrap_tool({path!r}): {module_name} has no {part!r}") from None
    if not callable(getattr(owner, attr, None)):
        raise CaptureError(f"wrap_tool({path!r}): {attr!r} is not a callable in {module_name}")
    return owner, attr


def wrap_tool(
    path: str,
    *,
    name: str | None = None,
    description: str | None = None,
    side_effect: str | None = None,
    gate: Any = None,
    snapshot: SnapshotSource = None,
    capture_content: bool | None = None,
    tracer_provider: TracerProvider | None = None,
) -> None:
    """Make an existing function a tool in place, by dotted path (no code change to it).

    ``wrap_tool("myagent.tools:get_weather")`` or ``wrap_tool("myagent.tools.Payments.refund")``;
    options as for :func:`tool`. Callers that imported the function by name before this
    call keep the unwrapped one. Wrapping twice is a no-op; :func:`unwrap_tool` undoes it.
    """
    owner, attr = _resolve(path)
    current = inspect.getattr_static(owner, attr)
    if isinstance(current, wrapt.FunctionWrapper) and getattr(current, "_self_otel_replay_tool", False):
        return
    original = getattr(owner, attr)
    spec = _make(original, name or attr, description, side_effect, gate, snapshot, capture_content, tracer_provider)
    if inspect.iscoroutinefunction(original):

        async def async_wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            return await spec.arun(wrapped, args, kwargs, instance)

        wrapper: Callable[..., Any] = async_wrapper
    else:

        def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            return spec.run(wrapped, args, kwargs, instance)

    wrapt.wrap_function_wrapper(owner, attr, wrapper)
    inspect.getattr_static(owner, attr)._self_otel_replay_tool = True


def unwrap_tool(path: str) -> None:
    """Undo :func:`wrap_tool`: the original function is put back (a no-op if it was not wrapped)."""
    owner, attr = _resolve(path)
    current = inspect.getattr_static(owner, attr)
    if isinstance(current, wrapt.FunctionWrapper) and getattr(current, "_self_otel_replay_tool", False):
        setattr(owner, attr, current.__wrapped__)
