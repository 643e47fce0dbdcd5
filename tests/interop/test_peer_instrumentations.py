"""Spans of the peers' OpenAI instrumentations, sent over OTLP to ``otel-replay serve``, fill model_calls and acts.

Each peer (the contrib openai-v2 instrumentor in its default and latest-conventions modes, OpenLLMetry,
OpenInference) instruments the real ``openai`` client in a process of its own (tests/interop/_peer_agent.py): five
calls against a scripted server, each tool the model asked for run under a tool span in the peer's convention, the
spans sent by the real OTLP/HTTP exporter to one ``otel-replay serve`` on loopback for the module. A peer that is not
installed is skipped: CI adds them to the test environment after the suite (`pip install -e '.[test,peers]'`, .ci/run).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import otel_replay

from ._peer_agent import PEERS

ROOT = Path(__file__).resolve().parents[2]

# run name -> (peer, extra environment, records the stream flag, puts tool calls on the span)
_RUNS: dict[str, tuple[str, dict[str, str], bool, bool]] = {
    "openai_v2": ("openai_v2", {}, False, False),
    "openai_v2_latest": (
        "openai_v2",
        {"OTEL_SEMCONV_STABILITY_OPT_IN": "gen_ai_latest_experimental",
         "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "SPAN_ONLY"},
        False,
        True,
    ),  # fmt: skip
    # content as OTLP log events only: one gen_ai.client.inference.operation.details record per call
    "openai_v2_events": ("openai_v2", {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "EVENT_ONLY"}, False,
                         False),  # fmt: skip
    "openllmetry": ("openllmetry", {"TRACELOOP_TRACE_CONTENT": "true"}, True, True),
    "openinference": ("openinference", {}, True, True),
}
_RESPONSES = {"chatcmpl-plain", "chatcmpl-stream", "chatcmpl-tool", "chatcmpl-st", "resp_1"}


def _installed(peer: str) -> bool:
    try:
        return importlib.util.find_spec(PEERS[peer]) is not None
    except ImportError:  # a parent package that is there but broken
        return False


def _runs() -> list[Any]:
    return [
        pytest.param(run, id=run, marks=pytest.mark.skipif(not _installed(peer), reason=f"{PEERS[peer]} not installed"))
        for run, (peer, _, _, _) in _RUNS.items()
    ]


@pytest.fixture(scope="module")
def received(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, dict[str, list[str]]]]:
    """Every installed peer's run sent to one ``serve``; the dataset's store and each run's tool call ids."""
    dataset = tmp_path_factory.mktemp("peers") / "received"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TRACELOOP_"))}
    serve = subprocess.Popen(
        [sys.executable, "-m", "otel_replay", "serve", "--dataset", str(dataset), "--grpc", "off",
         "--http", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    ran: dict[str, list[str]] = {}
    try:
        assert serve.stdout is not None
        line = serve.stdout.readline()
        port = re.search(r"http 127\.0\.0\.1:(\d+)", line)
        assert port, (line, serve.stderr.read() if serve.poll() is not None and serve.stderr else "")
        url = f"http://127.0.0.1:{port.group(1)}/v1/traces"
        for run, (peer, extra, _, _) in _RUNS.items():
            if not _installed(peer):
                continue
            out = subprocess.run(
                [sys.executable, "-m", "tests.interop._peer_agent", peer, url, run],
                capture_output=True, text=True, env={**env, **extra, "PYTHONPATH": str(ROOT)}, cwd=ROOT, timeout=120,
            )  # fmt: skip
            assert out.returncode == 0, out.stderr
            ran[run] = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        serve.send_signal(signal.SIGTERM)
        _, err = serve.communicate(timeout=60)
    assert serve.returncode == 0, err
    with otel_replay.open(dataset) as store:
        yield store, ran


def _model_calls(store: Any, run: str) -> dict[str, dict[str, Any]]:
    rows = store.rows(
        "SELECT m.* FROM model_calls m JOIN spans s USING (trace_id, span_id) WHERE s.service_name = ?", [run]
    )
    by_response = {row["response_id"]: row for row in rows}
    assert len(by_response) == len(rows), rows  # one row per call
    return by_response


@pytest.mark.parametrize("run", _runs())
def test_every_call_the_peer_traced_is_one_model_call(received: tuple[Any, dict[str, list[str]]], run: str) -> None:
    store, _ = received
    peer, _, records_stream, _ = _RUNS[run]
    calls = _model_calls(store, run)
    traced = store.rows("SELECT count(*) AS n FROM spans WHERE service_name = ? AND kind = 'CLIENT'", [run])
    # openai-v2 makes no span for responses.create; the others trace all five calls.
    expected = _RESPONSES - {"resp_1"} if peer == "openai_v2" else _RESPONSES
    assert set(calls) == expected, calls
    if peer != "openinference":  # OpenInference's spans are INTERNAL
        assert traced == [{"n": len(expected)}]
    for response_id, row in calls.items():
        assert (row["model"], row["provider"], row["operation"]) == ("gpt-test", "openai", "chat"), row
        tokens = (13, 5) if response_id == "resp_1" else (11, 7)
        assert (row["input_tokens"], row["output_tokens"]) == tokens, row
        streamed = response_id in ("chatcmpl-stream", "chatcmpl-st")
        assert row["streamed"] is (streamed and records_stream), row


@pytest.mark.parametrize("run", _runs())
def test_tool_calls_reach_the_column_and_the_acts_join(received: tuple[Any, dict[str, list[str]]], run: str) -> None:
    store, ran = received
    _, _, _, calls_on_span = _RUNS[run]
    assert ran[run] == ["call_plain", "call_streamed"]
    calls = _model_calls(store, run)
    acts = store.rows(
        """WITH mine AS (SELECT m.* FROM model_calls m JOIN spans s USING (trace_id, span_id) WHERE s.service_name = $1)
           SELECT a.tool_name, a.tool_call_id, list(m.response_id) FILTER (WHERE m.response_id IS NOT NULL) AS asked_by
           FROM acts a JOIN spans s USING (trace_id, span_id)
           LEFT JOIN mine m ON m.tool_calls LIKE '%"' || a.tool_call_id || '"%'
           WHERE s.service_name = $1 AND a.source = 'tool' GROUP BY ALL ORDER BY a.tool_call_id""",
        [run],
    )
    if not calls_on_span:
        # Without a span content mode the contrib instrumentor puts no tool calls on the span (EVENT_ONLY sends
        # them as log records: see the test below).
        assert all(row["tool_calls"] is None for row in calls.values())
        assert [(a["tool_call_id"], a["asked_by"]) for a in acts] == [("call_plain", None), ("call_streamed", None)]
        return
    assert [c["id"] for c in json.loads(calls["chatcmpl-tool"]["tool_calls"])] == ["call_plain"]
    assert [c["name"] for c in json.loads(calls["chatcmpl-st"]["tool_calls"])] == ["get_weather"]
    assert calls["chatcmpl-plain"]["tool_calls"] is None
    assert acts == [
        {"tool_name": "get_weather", "tool_call_id": "call_plain", "asked_by": ["chatcmpl-tool"]},
        {"tool_name": "get_weather", "tool_call_id": "call_streamed", "asked_by": ["chatcmpl-st"]},
    ]


@pytest.mark.skipif(not _installed("openai_v2"), reason=f"{PEERS['openai_v2']} not installed")
def test_the_contrib_instrumentors_log_events_carry_the_tool_calls_joined_to_their_model_call(
    received: tuple[Any, dict[str, list[str]]],
) -> None:
    # with EVENT_ONLY its spans carry no content and each call's messages go out as one OTLP log record, which
    # serve stores beside the spans: it joins its model call by trace and span id, tool calls and all
    store, ran = received
    events = store.rows(
        """SELECT m.response_id, m.tool_calls, e.event_name, e.attributes FROM genai_events e
           JOIN model_calls m USING (trace_id, span_id) JOIN spans s USING (trace_id, span_id)
           WHERE s.service_name = 'openai_v2_events' ORDER BY m.response_id"""
    )
    assert [(e["response_id"], e["event_name"]) for e in events] == [
        (response_id, "gen_ai.client.inference.operation.details")
        for response_id in sorted(_RESPONSES - {"resp_1"})  # no span, so no event, for responses.create
    ], events
    asked = {}
    for e in events:
        assert e["tool_calls"] is None  # not on the span
        [output] = json.loads(e["attributes"])["gen_ai.output.messages"]  # a structured value, not a JSON text
        asked[e["response_id"]] = [part["id"] for part in output["parts"] if part["type"] == "tool_call"]
    assert asked == {"chatcmpl-plain": [], "chatcmpl-stream": [], "chatcmpl-tool": ["call_plain"],
                     "chatcmpl-st": ["call_streamed"]}  # fmt: skip
    assert ran["openai_v2_events"] == ["call_plain", "call_streamed"]
    loose = store.rows("SELECT count(*) AS n FROM log_records WHERE service_name LIKE 'openai_v2%' AND span_id IS NULL")
    assert loose == [{"n": 0}]  # every record was emitted inside its call's span
