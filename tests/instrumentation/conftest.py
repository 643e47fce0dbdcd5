"""Fixtures: a scripted model server, an in-memory span pipeline, and the instrumentors turned on over it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_replay import CorrelationSpanProcessor
from otel_replay import semconv as sc
from otel_replay.capture.recorder import Recorder, set_recorder
from otel_replay.instrumentation import AnthropicInstrumentor, OpenAIInstrumentor, ThreadContextInstrumentor
from otel_replay.instrumentation.scripted import ScriptedServer


@dataclass
class Pipeline:
    provider: TracerProvider
    exporter: InMemorySpanExporter

    def spans(self, name_prefix: str = "") -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.name.startswith(name_prefix)]

    def one(self, name_prefix: str) -> ReadableSpan:
        found = self.spans(name_prefix)
        assert len(found) == 1, [s.name for s in self.exporter.get_finished_spans()]
        return found[0]


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as scripted:
        yield scripted


@pytest.fixture
def pipeline() -> Iterator[Pipeline]:
    provider = TracerProvider()
    provider.add_span_processor(CorrelationSpanProcessor())
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    previous = set_recorder(Recorder(provider.get_tracer(sc.INSTRUMENTATION_NAME)))
    yield Pipeline(provider, exporter)
    set_recorder(previous)
    provider.shutdown()


@pytest.fixture
def instrumented(pipeline: Pipeline) -> Iterator[Pipeline]:
    """OpenAI, Anthropic and thread-pool instrumentation on, content capture off."""
    instrumentors = [OpenAIInstrumentor(), AnthropicInstrumentor(), ThreadContextInstrumentor()]
    for instrumentor in instrumentors:
        instrumentor.instrument(tracer_provider=pipeline.provider, capture_content=False)
    yield pipeline
    for instrumentor in instrumentors:
        instrumentor.uninstrument()


@pytest.fixture
def capturing(pipeline: Pipeline) -> Iterator[Pipeline]:
    """OpenAI and Anthropic instrumentation on, content capture on."""
    instrumentors = [OpenAIInstrumentor(), AnthropicInstrumentor()]
    for instrumentor in instrumentors:
        instrumentor.instrument(tracer_provider=pipeline.provider, capture_content=True)
    yield pipeline
    for instrumentor in instrumentors:
        instrumentor.uninstrument()
