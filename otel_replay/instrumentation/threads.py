"""``ThreadContextInstrumentor``: work submitted to a thread pool runs in the submitter's context.

``concurrent.futures.ThreadPoolExecutor.submit`` (and so ``map`` and asyncio's
``run_in_executor``) normally runs the function in the worker thread's own,
empty context: a model or tool call made there would start a new trace,
detached from the decision that asked for it, and without its correlation
ids. With this instrumentor each submitted call runs in a copy of the
submitting context (``contextvars.copy_context().run``), so its spans are
children of the span current at ``submit`` and carry the same ids.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Collection
from typing import Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]

from otel_replay.instrumentation._common import Layers

__all__ = ["ThreadContextInstrumentor"]


def _submit(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if not args:
        return wrapped(*args, **kwargs)
    fn, *rest = args
    return wrapped(contextvars.copy_context().run, fn, *rest, **kwargs)


class ThreadContextInstrumentor(BaseInstrumentor):
    """Propagate the OpenTelemetry context (and so the decision and its ids) into thread-pool work.

    Entry point: ``otel_replay_threads``.
    """

    def instrumentation_dependencies(self) -> Collection[str]:
        """Standard library only."""
        return ()

    def _instrument(self, **kwargs: Any) -> None:
        self._layers = Layers()
        self._layers.wrap("concurrent.futures.thread", "ThreadPoolExecutor.submit", _submit)

    def _uninstrument(self, **kwargs: Any) -> None:
        self._layers.remove()
