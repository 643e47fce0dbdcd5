"""Instrumented model and tool calls land in the Parquet dataset, in-process and under opentelemetry-instrument."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import openai
import pytest

import otel_replay
from otel_replay import ActionGate, ReferenceLedger, audit
from otel_replay.instrumentation import OpenAIInstrumentor, scripted, tool
from tests._support import payment, snapshot


@pytest.fixture
def openai_on(telemetry):
    OpenAIInstrumentor().instrument(tracer_provider=telemetry.provider, capture_content=False)
    yield telemetry
    OpenAIInstrumentor().uninstrument()


def test_model_and_tool_rows_carry_the_decisions_record_id(server, openai_on, dataset: Path):
    telemetry = openai_on
    server.enqueue(
        s_reply := scripted.chat_completion(
            None, tool_calls=[("call_1", "check_budget", {"dept": "ops"})], usage=(120, 9)
        )
    )
    assert s_reply.status == 200

    @tool(side_effect="read", tracer_provider=telemetry.provider)
    def check_budget(dept: str) -> int:
        return 10_000

    gate = ActionGate(ReferenceLedger(balance=10_000), dataset=dataset)
    with audit("vendor_payment", snapshot=snapshot(), agent_id="payables") as d:
        with openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0) as c:
            reply = c.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "pay"}])
        call = reply.choices[0].message.tool_calls[0]
        check_budget(**json.loads(call.function.arguments))
        d.act(payment())
        gate.commit(payment(), record_id=d.record_id)
    telemetry.shutdown()

    store = otel_replay.open(dataset)
    [model] = store.rows("SELECT * FROM model_calls WHERE provider = 'openai'")
    assert model["record_id"] == d.record_id and model["agent_id"] == "payables"
    assert (model["input_tokens"], model["output_tokens"]) == (120, 9)
    assert json.loads(model["finish_reasons"]) == ["tool_calls"]
    assert json.loads(model["tool_calls"]) == [{"id": "call_1", "name": "check_budget"}]
    assert model["operation"] == "chat" and model["model"] == "gpt-test" and model["streamed"] is False
    acts = {row["source"]: row for row in store.rows("SELECT * FROM acts WHERE record_id = ?", [d.record_id])}
    assert set(acts) == {"act", "tool"}
    assert acts["tool"]["tool_name"] == "check_budget" and acts["tool"]["tool_call_id"] == "call_1"
    assert acts["tool"]["side_effect"] == "read" and acts["tool"]["action_arguments"] is None
    assert acts["act"]["action_type"] == "vendor_payment" and acts["act"]["tool_name"] is None
    # tool spans are not model calls
    assert store.rows("SELECT count(*) AS n FROM model_calls WHERE operation = 'execute_tool'")[0]["n"] == 0


AGENT = textwrap.dedent(
    """
    import os, openai, requests
    from opentelemetry import baggage, context
    context.attach(baggage.set_baggage("replay.correlation_id", "corr-zero"))  # as if propagated in from upstream
    requests.post(os.environ["AGENT_BASE_URL"] + "/ping", json={"api_key": "sk-zero-abcdefghijklmnopqrst"}, timeout=10)
    client = openai.OpenAI(base_url=os.environ["AGENT_BASE_URL"], api_key="sk-agent", max_retries=0)
    first = client.chat.completions.create(model="gpt-zero-code", messages=[{"role": "user", "content": "hi"}])
    stream = client.chat.completions.create(model="gpt-zero-code", messages=[], stream=True)
    print(first.choices[0].message.content + "".join(c.choices[0].delta.content or "" for c in stream if c.choices))
    """
)


def run_agent(tmp_path: Path, server: scripted.ScriptedServer, dataset: Path, **extra_env: str) -> str:
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    env = {
        **os.environ,
        "AGENT_BASE_URL": server.base_url,
        "OTEL_TRACES_EXPORTER": "otel_replay",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
        "OTEL_SERVICE_NAME": "zero-code-agent",
        "OTEL_REPLAY_DATASET": str(dataset),
        **extra_env,
    }
    launcher = Path(sys.executable).parent / "opentelemetry-instrument"
    done = subprocess.run(
        [str(launcher), sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.slow
def test_an_unmodified_agent_under_opentelemetry_instrument_lands_its_model_spans(server, tmp_path, dataset):
    server.enqueue(
        scripted.Reply(200, {"pong": True}),
        scripted.chat_completion("Hello, ", usage=(4, 2)),
        scripted.chat_stream(["wor", "ld"]),
    )
    # Every instrumentor the launcher finds loads but the Anthropic one (the agent makes no Anthropic call; its
    # import is 1.5 s of CPU a start): test_startup_settings starts a process with all of them.
    disabled = "otel_replay_anthropic"
    assert run_agent(tmp_path, server, dataset, OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=disabled) == "Hello, world"
    store = otel_replay.open(dataset)
    # every span, the requests instrumentation's included, carries the correlation id from baggage
    kinds = store.rows("SELECT name, kind, correlation_id FROM spans ORDER BY start_time")
    assert {r["correlation_id"] for r in kinds} == {"corr-zero"}
    assert any(r["kind"] == "CLIENT" and r["name"] == "POST" for r in kinds)
    # content capture is off: no HTTP body, no prompt
    assert store.rows("SELECT count(*) AS n FROM spans WHERE attributes LIKE '%replay.http.request.body%'")[0]["n"] == 0
    rows = store.rows(
        "SELECT m.*, s.service_name AS service FROM model_calls m JOIN spans s USING (trace_id, span_id) "
        "WHERE m.provider = 'openai' ORDER BY m.start_time"
    )
    assert [r["model"] for r in rows] == ["gpt-zero-code", "gpt-zero-code"]
    assert rows[0]["input_tokens"] == 4 and rows[1]["streamed"] is True
    assert {r["service"] for r in rows} == {"zero-code-agent"}


@pytest.mark.slow
def test_disabling_our_instrumentor_by_name_leaves_no_model_spans(server, tmp_path, dataset):
    server.enqueue(scripted.Reply(200, {}), scripted.chat_completion("a"), scripted.chat_stream(["b"]))
    # the Anthropic one too (the agent has no Anthropic call): its import is 1.5 s of CPU a start
    disabled = "otel_replay_openai,otel_replay_anthropic"
    assert run_agent(tmp_path, server, dataset, OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=disabled) == "ab"
    store = otel_replay.open(dataset)
    assert store.rows("SELECT count(*) AS n FROM model_calls WHERE provider = 'openai'")[0]["n"] == 0
    assert store.rows("SELECT count(*) AS n FROM spans")[0]["n"] > 0  # the HTTP client's spans still land


@pytest.mark.slow
def test_with_capture_on_the_zero_code_agent_records_redacted_content(server, tmp_path, dataset):
    server.enqueue(scripted.Reply(200, {}), scripted.chat_completion("done"), scripted.chat_stream(["!"]))
    env = {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"}
    # the agent makes no Anthropic call: that instrumentor (whose import is 1.5 s of CPU a start) is left out
    env["OTEL_PYTHON_DISABLED_INSTRUMENTATIONS"] = "otel_replay_anthropic"
    assert run_agent(tmp_path, server, dataset, **env) == "done!"
    store = otel_replay.open(dataset)
    posts = store.rows("SELECT attributes FROM spans WHERE name = 'POST' AND attributes LIKE '%/ping%'")
    [post] = [{"body": json.loads(p["attributes"]).get("replay.http.request.body")} for p in posts]
    assert "api_key" in post["body"] and "abcdefghijklmnopqrst" not in post["body"] and "[REDACTED]" in post["body"]
    prompts = store.rows(
        "SELECT input_messages, output_messages FROM model_calls WHERE provider = 'openai' ORDER BY start_time"
    )
    assert json.loads(prompts[0]["input_messages"]) == [{"role": "user", "parts": [{"type": "text", "content": "hi"}]}]
    assert "done" in prompts[0]["output_messages"]
