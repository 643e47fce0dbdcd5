"""instrument() does not import a model client the application has not imported; the client is wrapped at its import.

``openai`` costs ~0.65 s of CPU to import and ``anthropic`` ~1.5 s; every start
under ``opentelemetry-instrument`` paid both when the instrumentors imported
them. Each client test runs in a fresh process: in this one the clients are imported already.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from otel_replay.instrumentation._common import PROXY, Layers

SPANS = """
import json, sys
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otel_replay.instrumentation import AnthropicInstrumentor, OpenAIInstrumentor
from otel_replay.instrumentation import scripted as s

provider = TracerProvider()
exporter = InMemorySpanExporter()
provider.add_span_processor(SimpleSpanProcessor(exporter))
instrumentors = [OpenAIInstrumentor(), AnthropicInstrumentor()]

def instrument():
    for instrumentor in instrumentors:
        instrumentor.instrument(tracer_provider=provider, capture_content=True)

if sys.argv[1] == "before":
    instrument()
    assert "openai" not in sys.modules and "anthropic" not in sys.modules, "instrument() imported a client"
import openai, anthropic
if sys.argv[1] == "after":
    instrument()
with s.ScriptedServer() as server:
    server.enqueue(s.chat_completion("paid", model="gpt-test-0613", usage=(31, 4), response_id="chatcmpl-1"))
    server.enqueue(s.anthropic_message("done", model="claude-test-1", usage=(12, 3)))
    openai.OpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0).chat.completions.create(
        model="gpt-test", messages=[{"role": "user", "content": "pay INV-1"}], temperature=0.2
    )
    anthropic.Anthropic(base_url=server.root_url, api_key="sk-test", max_retries=0).messages.create(
        model="claude-test", max_tokens=10, messages=[{"role": "user", "content": "pay INV-1"}]
    )
    port = server.port
shown = []
for span in exporter.get_finished_spans():
    attrs = {k: (list(v) if isinstance(v, tuple) else v) for k, v in span.attributes.items()}
    attrs = {k: ("PORT" if v == port else v) for k, v in attrs.items()}
    shown.append({"name": span.name, "kind": span.kind.name, "status": span.status.status_code.name,
                  "scope": span.instrumentation_scope.name, "attributes": attrs})
print(json.dumps(shown, sort_keys=True))
"""

LIFECYCLE = """
import sys
from otel_replay.instrumentation import AnthropicInstrumentor, OpenAIInstrumentor
from otel_replay.instrumentation._common import PROXY

def layers(owner, attr):
    count, current = 0, vars(owner)[attr]
    while isinstance(current, PROXY):
        count, current = count + 1, current.__wrapped__
    return count

openai_, anthropic_ = OpenAIInstrumentor(), AnthropicInstrumentor()
if sys.argv[1] == "uninstrument":
    openai_.instrument(); anthropic_.instrument()
    openai_.uninstrument(); anthropic_.uninstrument()
    from openai.resources.chat.completions.completions import Completions
    from anthropic.resources.messages.messages import Messages
    print(layers(Completions, "create"), layers(Messages, "create"), layers(Messages, "stream"))
    openai_.instrument(); anthropic_.instrument()  # the client is imported now: wrapped at once
    print(layers(Completions, "create"), layers(Messages, "create"), layers(Messages, "stream"))
else:  # instrument, uninstrument and instrument again, all before the import
    for _ in range(2):
        openai_.instrument(); anthropic_.instrument()
        if _ == 0:
            openai_.uninstrument(); anthropic_.uninstrument()
    from openai.resources.chat.completions.completions import Completions
    from openai.resources.responses.responses import AsyncResponses
    from anthropic.resources.messages.messages import AsyncMessages
    print(layers(Completions, "create"), layers(AsyncResponses, "create"), layers(AsyncMessages, "stream"))
openai_.uninstrument(); anthropic_.uninstrument()
print(layers(Completions, "create"))
"""

ZERO_CODE_APP = """
import sys
print("openai" in sys.modules, "anthropic" in sys.modules)
from openai.resources.chat.completions.completions import Completions
from anthropic.resources.messages.messages import Messages
from otel_replay.instrumentation._common import PROXY
print(isinstance(vars(Completions)["create"], PROXY), isinstance(vars(Messages)["create"], PROXY))
"""


def run(*argv: str) -> str:
    done = subprocess.run([*argv], capture_output=True, text=True, timeout=180, env=_env())
    assert done.returncode == 0, done.stderr
    return done.stdout


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OPENAI_", "ANTHROPIC_"))}
    return {**env, "OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none"}


@pytest.mark.slow
def test_a_client_imported_after_instrument_is_traced_as_when_imported_before() -> None:
    late = json.loads(run(sys.executable, "-c", SPANS, "before"))
    early = json.loads(run(sys.executable, "-c", SPANS, "after"))
    assert [span["name"] for span in late] == ["chat gpt-test", "chat claude-test"]
    assert late[0]["attributes"]["gen_ai.response.id"] == "chatcmpl-1"
    assert late == early


@pytest.mark.slow
def test_uninstrument_before_the_import_leaves_the_client_unwrapped_and_instrument_again_wraps_once() -> None:
    assert run(sys.executable, "-c", LIFECYCLE, "uninstrument").split("\n")[:3] == ["0 0 0", "1 1 1", "0"]


@pytest.mark.slow
def test_instrument_uninstrument_instrument_before_the_import_wraps_once() -> None:
    assert run(sys.executable, "-c", LIFECYCLE, "again").split("\n")[:2] == ["1 1 1", "0"]


@pytest.mark.slow
def test_zero_code_start_does_not_load_a_client_the_app_does_not_import() -> None:
    launcher = Path(sys.executable).parent / "opentelemetry-instrument"
    lines = run(str(launcher), sys.executable, "-c", ZERO_CODE_APP).split("\n")
    # not loaded at start, yet wrapped once the app imports it: the instrumentors did run
    assert lines[:2] == ["False False", "True True"]


def test_a_wrap_that_fails_at_import_is_logged_and_the_import_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    name = "otel_replay_lazy_client_stand_in"
    (tmp_path / f"{name}.py").write_text("class Client:\n    def create(self):\n        return 'made'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)
    layers = Layers()
    layers.wrap_when_imported(
        name, {"Client.create": lambda wrapped, instance, args, kwargs: wrapped(), "Missing.create": print}
    )
    with caplog.at_level(logging.WARNING, logger="otel_replay.instrumentation"):
        module = __import__(name)
    sys.modules.pop(name)
    assert not isinstance(vars(module.Client)["create"], PROXY)  # the layer that went in was taken out again
    assert module.Client().create() == "made"
    assert not layers
    assert f"could not wrap {name} on import" in caplog.text
