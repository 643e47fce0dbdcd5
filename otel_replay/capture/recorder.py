"""The process's recorder: which tracer records go to, and the hash chain that seals them."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Link, Tracer

from otel_replay import semconv as sc
from otel_replay.capture.context import scope_attributes
from otel_replay.capture.sinks import MemorySink
from otel_replay.integrity import Chain, SigningKey, load_signing_key
from otel_replay.records import Seal, SpanRef

__all__ = ["Recorder", "get_recorder", "set_recorder"]

_VERSION = "0.1.0"


class Recorder:
    """Holds the tracer records are emitted through, the hash chain and the default sink.

    The tracer defaults to the global ``TracerProvider`` (resolved lazily, so a
    provider set up after import is used). The chain is created on first use
    with the key from :func:`otel_replay.integrity.load_signing_key`.
    """

    def __init__(self, tracer: Tracer | None = None, key: SigningKey | None = None) -> None:
        """Create a recorder; ``tracer`` and ``key`` default as described above."""
        self.tracer: Tracer = tracer or trace.get_tracer(sc.INSTRUMENTATION_NAME, _VERSION)
        self.sink = MemorySink()
        self._key = key
        self._chain: Chain | None = None
        self._lock = threading.Lock()

    @property
    def chain(self) -> Chain:
        """The hash chain this process seals records into."""
        if self._chain is None:
            with self._lock:
                if self._chain is None:
                    key = self._key or load_signing_key()
                    assert key is not None
                    self._chain = Chain(key)
        return self._chain

    def emit(
        self,
        name: str,
        record_id: str,
        attributes: dict[str, Any],
        *,
        links: Sequence[Link] = (),
    ) -> tuple[SpanRef, Seal]:
        """Emit a finished record as one sealed span under the current context."""
        # Stamp the scope's ids now, as the span processor would at start, so
        # the sealed hash covers exactly the attributes the span will carry.
        attributes.update(scope_attributes(attributes))
        start_ns = time.time_ns()
        seal = self.chain.seal(record_id, name, start_ns, attributes)
        span = self.tracer.start_span(name, attributes=attributes, links=links, start_time=start_ns)
        ctx = span.get_span_context()
        span.end(end_time=start_ns)
        return SpanRef(f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}", start_ns), seal


_current = Recorder()


def get_recorder() -> Recorder:
    """The recorder capture APIs use."""
    return _current


def set_recorder(recorder: Recorder) -> Recorder:
    """Replace the recorder; returns the previous one (to restore later)."""
    global _current
    previous, _current = _current, recorder
    return previous
