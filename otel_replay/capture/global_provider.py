"""The global ``TracerProvider`` :func:`otel_replay.configure` installs: one that forwards to the current pipeline.

OpenTelemetry lets a process set its global provider once. With
``configure()``'s own SDK provider there, every span of other
instrumentations (contrib ``httpx``/``requests``, ``trace.get_tracer("x")`` in
user code, tracers instrumentors cached when they were instrumented) went to
the first pipeline for good: after ``configure(a).shutdown()`` and
``configure(b)`` they were dropped without a word.

So ``configure(set_global=True)`` installs a :class:`ForwardingTracerProvider`
instead, once per process, and points it at its pipeline. Its tracers (also
those handed out before a reconfigure, and the API's proxy tracers handed out
before the first ``configure()``) start each span on the pipeline it points
at *when the span starts*:

* the first pipeline configured with ``set_global=True`` while it is open; a
  second one configured while the first is still open does not take over
  (as before: the global provider was the first one), it is next in line;
* when the pipeline it points at shuts down, the newest one still open of
  those configured with ``set_global=True`` since; with none, nothing: spans
  started then are non-recording (the parent's context still propagates),
  logged once and counted in ``stats.spans_dropped_after_shutdown`` of this
  provider (``opentelemetry.trace.get_tracer_provider().stats``), until the
  next ``configure()``.

A span belongs to the pipeline it started on: one still open when that
pipeline shuts down and ended after it is lost with it (the SDK drops it), not
moved to the next. A provider the user installed as the global one before
``configure()`` (their own SDK provider, or the one ``opentelemetry-instrument``
configured) is left alone, and ``set_global=False`` leaves the global
provider as it is. Anything else asked of this provider (``add_span_processor``,
``resource``, ``shutdown``, ...) is the current pipeline's provider's, as it was
when that provider was the global one.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Tracer, TracerProvider
from opentelemetry.util import types

# The decorator the API's and the SDK's tracers give start_as_current_span: usable as a context manager and as a
# decorator of plain and async functions alike. Private to OpenTelemetry, so imported under one name here.
from opentelemetry.util._decorator import _agnosticcontextmanager

__all__ = ["ForwardingTracerProvider", "GlobalProviderStats", "dropping", "forward_globally", "retire"]

_log = logging.getLogger(__name__)


@dataclass
class GlobalProviderStats:
    """What the global provider could not forward: counted, never silent."""

    spans_dropped_after_shutdown: int = 0
    """Spans started through it while no pipeline was open: after the last one shut down, before the next one."""


class _Nowhere(TracerProvider):
    """Where the forwarder points while no pipeline is open: each span started is counted, the first one logged."""

    def __init__(self, forwarder: ForwardingTracerProvider) -> None:
        self._forwarder = forwarder

    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: types.Attributes = None,
    ) -> Tracer:
        return _DroppingTracer(self._forwarder, instrumenting_module_name)


class _DroppingTracer(trace.NoOpTracer):
    """OpenTelemetry's no-op tracer (a span carries its parent's context on), counting what it is asked to start."""

    def __init__(self, forwarder: ForwardingTracerProvider, scope: str) -> None:
        self._forwarder = forwarder
        self._scope = scope

    def start_span(
        self,
        name: str,
        context: Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: types.Attributes = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> Span:
        self._forwarder._dropped(name, self._scope)
        return super().start_span(name, context, kind, attributes, links, start_time)


class ForwardingTracerProvider(TracerProvider):
    """The global provider ``configure()`` installs: its tracers start spans on the current pipeline's provider.

    See the module docstring for which pipeline that is. Made and installed
    by :func:`forward_globally`, once per process.

    Attributes:
        stats: what could not be forwarded (:class:`GlobalProviderStats`).

    """

    def __init__(self) -> None:
        """An empty forwarder: spans go nowhere (counted) until :func:`forward_globally` gives it a pipeline."""
        self._nowhere = _Nowhere(self)
        self._target: TracerProvider = self._nowhere  # read without the lock as each span starts: one attribute
        self._open: list[TracerProvider] = []  # the set_global pipelines' providers still open, oldest first
        self._lock = threading.Lock()
        self._warned = False
        self._tracers: dict[tuple[Any, ...], _ForwardingTracer] = {}
        self.stats = GlobalProviderStats()

    @property
    def current(self) -> TracerProvider | None:
        """The provider of the pipeline spans start on now; ``None``: no pipeline is open (spans are dropped)."""
        target = self._target
        return None if target is self._nowhere else target

    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: types.Attributes = None,
    ) -> Tracer:
        """A tracer that starts each span on the current pipeline (its tracer for this scope).

        One per scope without attributes, kept (as the SDK keeps its own): code
        that asks for its tracer for every span finds it bound already.
        """
        scope = (instrumenting_module_name, instrumenting_library_version, schema_url)
        if attributes is not None:
            return _ForwardingTracer(self, (*scope, attributes))
        tracer = self._tracers.get(scope)
        if tracer is None:
            tracer = _ForwardingTracer(self, (*scope, None))
            if len(self._tracers) < _MOST_SCOPES:  # a process has a few scopes: a runaway number is not all kept
                tracer = self._tracers.setdefault(scope, tracer)
        return tracer

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """The current pipeline's provider's ``force_flush``; ``False`` while no pipeline is open."""
        target = self.current
        flush = getattr(target, "force_flush", None)
        return bool(flush(timeout_millis)) if flush is not None else False

    def add_span_processor(self, span_processor: Any) -> None:
        """Add ``span_processor`` to the current pipeline's provider: it belongs to that pipeline, not the next.

        Raises:
            RuntimeError: no pipeline is open.

        """
        target = self.current
        if target is None:
            raise RuntimeError("no otel_replay.configure() pipeline is open to add the span processor to")
        target.add_span_processor(span_processor)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> Any:
        # What code that took the global provider for the SDK's asks for (resource, shutdown, sampler, ...): the
        # current pipeline's, as when its provider was the global one. Only names this class does not define.
        if name.startswith("__") or name in _OWN:
            raise AttributeError(name)
        target = self.current
        if target is None:
            raise AttributeError(f"{name!r}: no otel_replay.configure() pipeline is open behind the global provider")
        return getattr(target, name)

    def _forward_to(self, provider: TracerProvider) -> None:
        with self._lock:
            if provider not in self._open:
                self._open.append(provider)
            if self._target is self._nowhere:
                self._target = provider

    def _retire(self, provider: TracerProvider) -> None:
        with self._lock:
            if provider not in self._open:
                return
            self._open.remove(provider)
            if self._target is provider:
                self._target = self._open[-1] if self._open else self._nowhere
                # Their next span binds again: none keeps the old pipeline alive. A copy: get_tracer() adds to the
                # dict without the lock (tuple() of a dict's values is one step under the GIL).
                for tracer in tuple(self._tracers.values()):
                    tracer._bound = _UNBOUND_PAIR

    def _dropped(self, name: str, scope: str) -> None:
        with self._lock:
            self.stats.spans_dropped_after_shutdown += 1
            first, self._warned = not self._warned, True
        if first:
            _log.warning(
                "otel-replay: span %r of %r was started after the pipeline otel_replay.configure() made global was "
                "shut down, and is dropped: call otel_replay.configure() again (counted in "
                "opentelemetry.trace.get_tracer_provider().stats.spans_dropped_after_shutdown; further ones are "
                "counted, not logged)",
                name,
                scope,
            )

    def _forked(self) -> None:
        self._lock = threading.Lock()  # maybe held by a parent's thread that does not run in the child
        self._warned = False  # the child's own losses are logged once too


_OWN = frozenset({"_nowhere", "_target", "_open", "_lock", "_warned", "_tracers", "stats"})
"""Attributes a forwarder has from ``__init__``: never looked up on the pipeline (e.g. while it is being built)."""


_UNBOUND_PAIR: tuple[TracerProvider | None, Tracer] = (None, trace.NoOpTracer())
"""A forwarding tracer's binding before its first span (to no provider, so never used)."""


class _ForwardingTracer(Tracer):
    """A tracer of :class:`ForwardingTracerProvider`: the current pipeline's tracer of the same scope, per span.

    The pipeline's tracer is looked up once per pipeline (kept with the
    provider it came from); a span costs three attribute reads more than
    through that tracer directly (and one call, through :meth:`start_span`).
    """

    def __init__(self, forwarder: ForwardingTracerProvider, scope: tuple[Any, ...]) -> None:
        self._forwarder = forwarder
        self._scope = scope
        self._bound: tuple[TracerProvider | None, Tracer] = _UNBOUND_PAIR

    def _bind(self, target: TracerProvider) -> Tracer:
        tracer = target.get_tracer(*self._scope)
        self._bound = (target, tracer)  # one tuple: a thread reads a provider and its own tracer, never a mix
        return tracer

    def start_span(
        self,
        name: str,
        context: Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: types.Attributes = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> Span:
        """The current pipeline's tracer's ``start_span``."""
        target = self._forwarder._target
        bound = self._bound
        tracer = bound[1] if bound[0] is target else self._bind(target)
        return tracer.start_span(
            name, context, kind, attributes, links, start_time, record_exception, set_status_on_exception
        )

    @_agnosticcontextmanager
    def start_as_current_span(
        self,
        name: str,
        context: Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: types.Attributes = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> Iterator[Span]:
        """As the SDK's: :meth:`start_span`, then the span made current (so a decorated function follows too)."""
        target = self._forwarder._target  # start_span's lines, not a call to it: one frame less per span
        bound = self._bound
        tracer = bound[1] if bound[0] is target else self._bind(target)
        span = tracer.start_span(
            name, context, kind, attributes, links, start_time, record_exception, set_status_on_exception
        )
        with trace.use_span(
            span,
            end_on_exit=end_on_exit,
            record_exception=record_exception,
            set_status_on_exception=set_status_on_exception,
        ) as current:
            yield current


_MOST_SCOPES = 1024
"""The most tracers a forwarder keeps (one per scope); past it, each ``get_tracer()`` makes a new one."""

_install = threading.Lock()
_installed: ForwardingTracerProvider | None = None


def forward_globally(provider: TracerProvider) -> bool:
    """For ``configure(set_global=True)``: the global provider forwards to ``provider``'s pipeline while it is open.

    Installs the :class:`ForwardingTracerProvider` as the global provider
    when none is set yet. ``False`` (nothing done) when the global provider is
    another one: a provider the user set up stays theirs.
    """
    global _installed
    with _install:
        current = trace.get_tracer_provider()
        if isinstance(current, trace.ProxyTracerProvider):
            forwarder = ForwardingTracerProvider()
            trace.set_tracer_provider(forwarder)
            current = trace.get_tracer_provider()  # ours, unless a provider was set meanwhile outside this lock
            if current is forwarder:
                _installed = forwarder
    if _installed is None or current is not _installed:
        return False
    _installed._forward_to(provider)
    return True


def retire(provider: TracerProvider) -> None:
    """``provider``'s pipeline is shutting down: the global provider's spans start on the next one, or nowhere."""
    if _installed is not None:
        _installed._retire(provider)


def dropping(provider: TracerProvider) -> bool:
    """True when ``provider`` is the forwarder and no pipeline is open behind it: spans started now are dropped."""
    return provider is _installed and provider._target is provider._nowhere


def _forked_child() -> None:
    global _install
    _install = threading.Lock()  # maybe held by a parent's thread configuring at the moment of the fork
    if _installed is not None:
        _installed._forked()


if hasattr(os, "register_at_fork"):  # not on Windows, where there is no fork
    os.register_at_fork(after_in_child=_forked_child)
