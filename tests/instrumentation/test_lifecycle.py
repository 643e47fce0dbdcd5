"""instrument()/uninstrument(): idempotent, exact restoration, entry points, no client import at module import."""

from __future__ import annotations

import importlib
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

import otel_replay.instrumentation as instr
from otel_replay.exporters import ParquetSpanExporter
from otel_replay.instrumentation import AnthropicInstrumentor, OpenAIInstrumentor, ThreadContextInstrumentor

TARGETS = [
    ("openai.resources.chat.completions.completions", "Completions", "create"),
    ("openai.resources.chat.completions.completions", "AsyncCompletions", "create"),
    ("openai.resources.responses.responses", "Responses", "create"),
    ("openai.resources.responses.responses", "AsyncResponses", "create"),
    ("anthropic.resources.messages.messages", "Messages", "create"),
    ("anthropic.resources.messages.messages", "AsyncMessages", "create"),
    ("anthropic.resources.messages.messages", "Messages", "stream"),
    ("anthropic.resources.messages.messages", "AsyncMessages", "stream"),
    ("concurrent.futures.thread", "ThreadPoolExecutor", "submit"),
]


def originals() -> list[object]:
    return [vars(getattr(importlib.import_module(m), owner))[attr] for m, owner, attr in TARGETS]


def test_instrument_twice_wraps_once_and_uninstrument_restores_the_exact_functions(pipeline):
    before = originals()
    assert set(instr.instrument(tracer_provider=pipeline.provider)) == {
        "OpenAIInstrumentor",
        "AnthropicInstrumentor",
        "ThreadContextInstrumentor",
    }
    try:
        instr.instrument(tracer_provider=pipeline.provider)
        OpenAIInstrumentor().instrument(tracer_provider=pipeline.provider)
        wrapped = originals()
        for original, now in zip(before, wrapped, strict=True):
            assert now is not original
            assert now.__wrapped__ is original  # one layer: the second instrument() added none
    finally:
        instr.uninstrument()
    after = originals()
    for original, now in zip(before, after, strict=True):
        assert now is original
    instr.uninstrument()  # twice: a no-op
    assert originals() == before


def test_the_entry_points_load_the_instrumentors():
    found = {
        ep.name: ep for ep in entry_points(group="opentelemetry_instrumentor") if ep.name.startswith("otel_replay")
    }
    assert {"otel_replay_openai", "otel_replay_anthropic", "otel_replay_threads"} <= set(found)
    assert found["otel_replay_openai"].load() is OpenAIInstrumentor
    assert found["otel_replay_anthropic"].load() is AnthropicInstrumentor
    assert found["otel_replay_threads"].load() is ThreadContextInstrumentor
    [exporter] = [ep for ep in entry_points(group="opentelemetry_traces_exporter") if ep.name == "otel_replay"]
    # a ParquetSpanExporter that stops opentelemetry-instrument at start on a bad setting
    assert issubclass(exporter.load(), ParquetSpanExporter)


BLOCKED = """
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('openai', 'anthropic'):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Block())
import pkgutil, otel_replay.instrumentation as pkg
for info in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + '.'):
    importlib.import_module(info.name)
assert 'openai' not in sys.modules and 'anthropic' not in sys.modules
print(pkg.instrument())
pkg.uninstrument()
"""


def test_every_module_imports_and_instrument_works_without_the_client_libraries():
    done = subprocess.run([sys.executable, "-c", BLOCKED], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['ThreadContextInstrumentor']"


@pytest.mark.parametrize("instrumentor", [OpenAIInstrumentor, AnthropicInstrumentor])
def test_instrumentation_dependencies_name_the_client(instrumentor):
    [requirement] = instrumentor().instrumentation_dependencies()
    assert requirement.split()[0] in ("openai", "anthropic")


def _foreign(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)


def test_uninstrument_takes_out_only_its_own_layer_when_another_wraps_on_top(pipeline):
    import wrapt

    before = originals()
    instr.instrument(tracer_provider=pipeline.provider)
    for module, owner, attr in TARGETS:  # a peer instrumentation installed after ours, on top of ours
        wrapt.wrap_function_wrapper(module, f"{owner}.{attr}", _foreign)
    foreign = originals()
    instr.uninstrument()
    after = originals()
    for original, theirs, now in zip(before, foreign, after, strict=True):
        assert now is theirs  # the peer's layer is still there ...
        assert now.__wrapped__ is original  # ... directly over the original: ours is gone
    for (module, owner, attr), original in zip(TARGETS, before, strict=True):
        setattr(getattr(importlib.import_module(module), owner), attr, original)
    assert originals() == before
