"""configure()'s global provider: other instrumentations' spans start on the pipeline configure() made current.

Each test runs in a child process: OpenTelemetry's global provider is set once per process, and the test
process's must stay unset (tests/conftest.py).
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

import otel_replay
from otel_replay.capture import get_recorder
from otel_replay.capture.global_provider import ForwardingTracerProvider

from .._support import forked_child_result, in_forked_child, start_forked_child


def _names(dataset: Path) -> list[str]:
    """The names of the spans stored in ``dataset``, sorted (none when nothing was ever written there)."""
    if not any(dataset.rglob("*.parquet")):
        return []
    with otel_replay.open(dataset) as store:
        return sorted(row["name"] for row in store.rows("SELECT name FROM spans"))


class _Said(logging.Handler):
    """The messages logged under ``otel_replay`` while attached."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        logging.getLogger("otel_replay").addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _forwarder() -> ForwardingTracerProvider:
    provider = trace.get_tracer_provider()
    assert isinstance(provider, ForwardingTracerProvider), provider
    return provider


def test_tracers_handed_out_before_a_reconfigure_start_their_spans_on_the_new_pipeline(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"

    def work() -> None:
        early = trace.get_tracer("early")  # before any configure(): the API's proxy tracer
        first = otel_replay.configure(a)
        cached = trace.get_tracer("cached")  # as an instrumentor caches its tracer when instrumented

        @cached.start_as_current_span("decorated")
        def decorated() -> None:
            pass

        with early.start_as_current_span("early-1"), cached.start_as_current_span("cached-1"):
            decorated()
        first.shutdown()
        with otel_replay.configure(b):
            with early.start_as_current_span("early-2"):
                cached.start_span("cached-2").end()
                decorated()

    in_forked_child(work)
    assert _names(a) == ["cached-1", "decorated", "early-1"]
    assert _names(b) == ["cached-2", "decorated", "early-2"]


def test_a_span_in_flight_across_the_shutdown_stays_with_its_pipeline_and_is_lost_with_it(tmp_path):
    """Decided: a span belongs to the pipeline it started on (its processors saw it start); the next one never gets
    it. Ended after that pipeline's shutdown, the SDK drops it; it is not counted with the spans started nowhere."""
    a, b = tmp_path / "a", tmp_path / "b"

    def work() -> int:
        tracer = trace.get_tracer("t")
        first = otel_replay.configure(a)
        in_flight = tracer.start_span("in-flight")
        with tracer.start_as_current_span("before"):
            pass
        first.shutdown()
        with otel_replay.configure(b):
            in_flight.end()
            with tracer.start_as_current_span("after"):
                pass
        return _forwarder().stats.spans_dropped_after_shutdown

    assert in_forked_child(work) == 0
    assert _names(a) == ["before"]
    assert _names(b) == ["after"]


def test_spans_started_with_no_pipeline_open_are_counted_and_logged_once_until_the_next_configure(tmp_path):
    a, c = tmp_path / "a", tmp_path / "c"

    def work() -> dict[str, Any]:
        said = _Said()
        tracer = trace.get_tracer("t")
        telemetry = otel_replay.configure(a)
        with tracer.start_as_current_span("kept"):
            pass
        telemetry.shutdown()
        with tracer.start_as_current_span("lost-1"):
            pass
        trace.get_tracer("other").start_span("lost-2").end()
        # An upstream parent's context still propagates through a dropped span (as with no provider at all).
        upstream = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
        lost = tracer.start_span("lost-3", context=trace.set_span_in_context(NonRecordingSpan(upstream)))
        forwarder = _forwarder()
        seen = {
            "dropped": forwarder.stats.spans_dropped_after_shutdown,
            "propagated": lost.get_span_context().trace_id == 0xABC,
            "warnings": list(said.messages),
            "recorder_closed": get_recorder().closed,  # the restored default recorder counts its records as lost
            "flushed": forwarder.force_flush(),
        }
        with otel_replay.configure(c):
            with tracer.start_as_current_span("found"):
                pass
            seen["dropped_after"] = forwarder.stats.spans_dropped_after_shutdown
            seen["recorder_closed_after"] = get_recorder().closed
        return seen

    seen = in_forked_child(work)
    (warning,) = seen.pop("warnings")
    assert "'lost-1'" in warning and "get_tracer_provider().stats.spans_dropped_after_shutdown" in warning
    assert seen == {
        "dropped": 3,
        "propagated": True,
        "recorder_closed": True,
        "flushed": False,
        "dropped_after": 3,
        "recorder_closed_after": False,
    }
    assert _names(a) == ["kept"]
    assert _names(c) == ["found"]


def test_a_provider_the_user_installed_before_configure_is_left_alone(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"

    def work() -> list[str]:
        mine, memory = TracerProvider(), InMemorySpanExporter()
        mine.add_span_processor(SimpleSpanProcessor(memory))
        trace.set_tracer_provider(mine)
        first = otel_replay.configure(a)
        assert trace.get_tracer_provider() is mine
        with trace.get_tracer("t").start_as_current_span("mine-1"):
            pass
        first.shutdown()
        with otel_replay.configure(b):
            assert trace.get_tracer_provider() is mine
            with trace.get_tracer("t").start_as_current_span("mine-2"):
                pass
        return [span.name for span in memory.get_finished_spans()]

    assert in_forked_child(work) == ["mine-1", "mine-2"]
    assert _names(a) == [] and _names(b) == []


def test_two_pipelines_open_at_once_the_first_keeps_the_spans_until_it_shuts_down(tmp_path):
    """As before the forwarder: the first pipeline configured with set_global stays global while open. Then the
    newest still open takes over; one configured with set_global=False never does."""
    a, b, c, d = (tmp_path / name for name in "abcd")

    def work() -> int:
        tracer = trace.get_tracer("t")
        first, second = otel_replay.configure(a), otel_replay.configure(b)
        tracer.start_span("both-open").end()
        first.shutdown()
        tracer.start_span("first-closed").end()
        third = otel_replay.configure(c)
        tracer.start_span("second-still-open").end()
        second.shutdown()
        tracer.start_span("second-closed").end()
        side = otel_replay.configure(d, set_global=False)
        third.shutdown()
        tracer.start_span("only-a-local-one-open").end()
        side.shutdown()
        return _forwarder().stats.spans_dropped_after_shutdown

    assert in_forked_child(work) == 1
    assert _names(a) == ["both-open"]
    assert _names(b) == ["first-closed", "second-still-open"]
    assert _names(c) == ["second-closed"]
    assert _names(d) == []


def test_user_span_processors_belong_to_the_pipeline_they_were_added_to(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"

    def work() -> dict[str, Any]:
        tracer = trace.get_tracer("t")
        first = otel_replay.configure(a, service_name="first")
        on_pipeline, on_global = InMemorySpanExporter(), InMemorySpanExporter()
        first.provider.add_span_processor(SimpleSpanProcessor(on_pipeline))
        trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(on_global))  # the current pipeline's
        service = trace.get_tracer_provider().resource.attributes["service.name"]  # type: ignore[attr-defined]
        tracer.start_span("in-a").end()
        first.shutdown()
        with otel_replay.configure(b, service_name="second"):
            tracer.start_span("in-b").end()
            service_after = trace.get_tracer_provider().resource.attributes["service.name"]  # type: ignore[attr-defined]
        return {
            "pipeline": [s.name for s in on_pipeline.get_finished_spans()],
            "global": [s.name for s in on_global.get_finished_spans()],
            "services": [service, service_after],
        }

    assert in_forked_child(work) == {"pipeline": ["in-a"], "global": ["in-a"], "services": ["first", "second"]}
    assert _names(b) == ["in-b"]


def test_threads_starting_spans_while_the_pipeline_is_swapped_reach_the_new_one_once_configured(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"

    def work() -> dict[str, Any]:
        tracer = trace.get_tracer("t")
        first = otel_replay.configure(a)
        swapped, stop = threading.Event(), threading.Event()
        after: list[list[str]] = [[], []]
        errors: list[str] = []

        def spans(made: list[str]) -> None:
            try:
                while not (stop.is_set() and len(made) >= 20):
                    later = swapped.is_set()  # set once configure(b) returned: a span started now is b's
                    name = f"after-{threading.get_ident()}-{len(made)}" if later else "before"
                    with tracer.start_as_current_span(name):
                        pass
                    if later:
                        made.append(name)
            except Exception as exc:  # noqa: BLE001 - reported to the test
                errors.append(repr(exc))

        threads = [threading.Thread(target=spans, args=(made,)) for made in after]
        for thread in threads:
            thread.start()
        time.sleep(0.05)
        first.shutdown()
        second = otel_replay.configure(b)
        swapped.set()
        time.sleep(0.05)
        stop.set()
        for thread in threads:
            thread.join()
        second.shutdown()
        return {"after": sorted(name for made in after for name in made), "errors": errors}

    done = in_forked_child(work)
    assert done["errors"] == []
    assert len(done["after"]) >= 40
    assert [name for name in _names(b) if name != "before"] == done["after"]


def test_a_forked_child_reconfigures_its_own_global_provider(tmp_path):
    """Forked while a thread held the forwarder's lock, a child's configure() does not wait for it forever (an alarm
    ends it otherwise); the child's pipeline is the child's, and the parent's global provider does not follow it."""
    a, b = tmp_path / "a", tmp_path / "b"

    def child(tracer: trace.Tracer) -> int:
        signal.alarm(60)
        with otel_replay.configure(b):
            with tracer.start_as_current_span("in-child"):
                pass
        return _forwarder().stats.spans_dropped_after_shutdown

    def work() -> dict[str, Any]:
        tracer = trace.get_tracer("t")
        first = otel_replay.configure(a)
        with tracer.start_as_current_span("in-parent"):
            pass
        first.shutdown()
        held, release = threading.Event(), threading.Event()

        def hold() -> None:
            with _forwarder()._lock:  # as a thread swapping pipelines at the moment of the fork
                held.set()
                release.wait()

        holder = threading.Thread(target=hold)
        holder.start()
        held.wait()
        try:
            forked = start_forked_child(lambda: child(tracer))
        finally:
            release.set()
            holder.join()
        in_child = forked_child_result(forked)
        tracer.start_span("parent-after-fork").end()  # the parent has no pipeline open: counted
        return {"child_dropped": in_child, "parent_dropped": _forwarder().stats.spans_dropped_after_shutdown}

    assert in_forked_child(work) == {"child_dropped": 0, "parent_dropped": 1}
    assert _names(a) == ["in-parent"]
    assert _names(b) == ["in-child"]


def test_the_global_provider_does_not_keep_a_shut_down_pipeline_alive(tmp_path):
    """Its tracers hold the pipeline's tracer they forward to; a shut-down pipeline (its provider, processors, log
    and recorder) must still be freed, as when the global provider was never set."""

    def work() -> bool:
        tracer = trace.get_tracer("t")
        telemetry = otel_replay.configure(tmp_path / "a")
        with tracer.start_as_current_span("kept"):
            pass
        provider = weakref.ref(telemetry.provider)
        telemetry.shutdown()
        del telemetry
        gc.collect()
        return provider() is None

    assert in_forked_child(work) is True


UNDER_THE_LAUNCHER = """
import sys
import otel_replay
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
configured = trace.get_tracer_provider()  # the distro's, made from OTEL_TRACES_EXPORTER=otel_replay
telemetry = otel_replay.configure(sys.argv[1])
assert trace.get_tracer_provider() is configured and type(configured) is TracerProvider, configured
with trace.get_tracer("contrib").start_as_current_span("launcher-span"):
    pass
telemetry.shutdown()
configured.force_flush()
print("ok")
"""


@pytest.mark.slow
def test_under_opentelemetry_instrument_configure_leaves_the_launchers_provider(tmp_path):
    """opentelemetry-instrument's distro sets an SDK provider before the application runs: it stays the global
    one, and other instrumentations' spans keep going where the launcher sends them, not to configure()'s dataset."""
    script, launched, configured = tmp_path / "app.py", tmp_path / "launched", tmp_path / "configured"
    script.write_text(UNDER_THE_LAUNCHER)
    env = {
        **os.environ,
        "OTEL_TRACES_EXPORTER": "otel_replay",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
        "OTEL_REPLAY_DATASET": str(launched),
        # Our model clients' instrumentors import their clients (over a second of CPU); this process has no calls.
        "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "otel_replay_openai,otel_replay_anthropic",
    }
    launcher = Path(sys.executable).parent / "opentelemetry-instrument"
    done = subprocess.run(
        [str(launcher), sys.executable, str(script), str(configured)], env=env, capture_output=True, text=True,
        timeout=180,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr
    assert "launcher-span" in _names(launched)
    assert _names(configured) == []
