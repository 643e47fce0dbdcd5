"""collector-config.yaml: valid structure, pointed at the receiver's defaults."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from otel_replay.server import ServerConfig

CONFIG = Path(__file__).resolve().parents[2] / "collector-config.yaml"
KINDS = ("receivers", "processors", "exporters")


def check_pipelines(config: dict[str, Any], defined: dict[str, dict[str, Any]]) -> None:
    pipelines = config["service"]["pipelines"]
    assert pipelines
    for name, pipeline in pipelines.items():
        assert name.split("/")[0] in ("traces", "logs")
        assert pipeline["receivers"] and pipeline["exporters"]
        for kind in KINDS:
            for component in pipeline.get(kind, []):
                assert component in defined[kind], f"pipeline {name} uses undefined {kind[:-1]} {component}"
        assert pipeline["processors"][0] == "memory_limiter"  # first, as the collector docs require


def commented_block(name: str) -> dict[str, Any]:
    text = CONFIG.read_text()
    match = re.search(rf"# BEGIN {name}\n(.*?)# END {name}", text, re.S)
    assert match, f"no commented block {name}"
    return yaml.safe_load("\n".join(line[2:] for line in match.group(1).splitlines()))


def test_main_pipeline_points_at_serve_defaults() -> None:
    config = yaml.safe_load(CONFIG.read_text())
    check_pipelines(config, config)
    exporter = config["exporters"]["otlp/otel-replay"]
    assert exporter["endpoint"] == ServerConfig(Path("x")).grpc == "127.0.0.1:4317"
    assert exporter["tls"]["insecure"] is True
    assert exporter["sending_queue"]["enabled"] is True and exporter["retry_on_failure"]["enabled"] is True
    assert config["processors"]["memory_limiter"]["check_interval"]
    assert "batch" in config["processors"]
    grpc_in = config["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]
    assert grpc_in != exporter["endpoint"]  # the collector does not listen on serve's port


def test_logs_go_to_serve_beside_the_traces() -> None:
    config = yaml.safe_load(CONFIG.read_text())
    pipelines = config["service"]["pipelines"]
    assert pipelines["logs"]["exporters"] == pipelines["traces"]["exporters"] == ["otlp/otel-replay"]
    assert pipelines["logs"]["receivers"] == ["otlp"]


@pytest.mark.parametrize("block", ["file-tee", "loadbalancing"])
def test_commented_alternatives_are_valid_when_uncommented(block: str) -> None:
    base = yaml.safe_load(CONFIG.read_text())
    extra = commented_block(block)
    merged = {kind: {**base.get(kind, {}), **extra.get(kind, {})} for kind in KINDS}
    check_pipelines(extra, merged)
    if block == "loadbalancing":
        lb = extra["exporters"]["loadbalancing/otel-replay"]
        assert lb["routing_key"] == "traceID" and len(lb["resolver"]["static"]["hostnames"]) >= 2
        assert lb["protocol"]["otlp"]["sending_queue"]["enabled"] is True
    else:
        assert extra["exporters"]["file/otel-replay"]["format"] == "json"


def test_a_batch_of_large_spans_fits_serve_request_limit() -> None:
    """Found in review (twelfth session): 16,384 spans a batch is 32 MiB at 2 KiB a span, which a GenAI span with its
    content passes, and serve refuses a request over 32 MiB with RESOURCE_EXHAUSTED, which the collector drops."""
    config = yaml.safe_load(CONFIG.read_text())
    batch = config["processors"]["batch"]
    assert batch["send_batch_size"] <= batch["send_batch_max_size"]
    assert batch["send_batch_max_size"] * 8 * 1024 <= ServerConfig(Path("x")).max_request_bytes
