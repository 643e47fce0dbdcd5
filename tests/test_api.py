from __future__ import annotations

import inspect
import re
from pathlib import Path

import otel_replay
from otel_replay import semconv as sc

QUERIES = Path(__file__).resolve().parents[1] / "queries"


def test_public_api_is_pinned():
    assert otel_replay.__all__ == sorted(otel_replay.__all__)
    expected = {
        "ContractError",
        "ContractLoadError",
        "GovernedSession",
        "ReplayContractError",
        "ReplayKillError",
        "govern",
        "load_contracts",
        "Action",
        "ActionGate",
        "AlreadyCompensated",
        "AuditEntry",
        "AuditLog",
        "AnthropicInstrumentor",
        "DeterminismLeakError",
        "Divergence",
        "GateResult",
        "OpenAIInstrumentor",
        "ReplayMismatchError",
        "RerunError",
        "RerunResult",
        "ThreadContextInstrumentor",
        "recording",
        "rerun",
        "tool",
        "unwrap_tool",
        "wrap_tool",
        "PayloadError",
        "ReadOnlyViolation",
        "Recorder",
        "RecordSampler",
        "RecorderStats",
        "RecordingError",
        "get_recorder",
        "invoke_agent",
        "set_recorder",
        "CHAIN_TYPES",
        "CaptureError",
        "CompensationPending",
        "ConfigError",
        "ConflictingRecords",
        "CorrelationSpanProcessor",
        "CorruptFileError",
        "DatasetError",
        "Decision",
        "DecisionRecord",
        "DecisionTracer",
        "DependencySnapshot",
        "FixAction",
        "GateError",
        "GateOutcome",
        "GateRecord",
        "IntegrityError",
        "MemorySink",
        "ModelCall",
        "OtelReplayError",
        "OutcomeAlreadyRecorded",
        "OutcomeRecord",
        "ParquetSpanExporter",
        "Policy",
        "PolicyError",
        "PolicyLoadError",
        "QueryError",
        "Rail",
        "Receipt",
        "RecordNotFound",
        "ReferenceLedger",
        "ReplayBuilder",
        "ReplayChain",
        "ReplayUndecidable",
        "Report",
        "Seal",
        "SealCheck",
        "SigningKey",
        "Sink",
        "SpanRef",
        "Store",
        "Telemetry",
        "UntrustedRecord",
        "Verdict",
        "VerifyReport",
        "__version__",
        "audit",
        "configure",
        "correlation",
        "current_ids",
        "execute_verdict",
        "load_policy",
        "load_signing_key",
        "open",
        "replay",
        "replay_stored",
        "session",
    }
    assert set(otel_replay.__all__) == expected
    for name in otel_replay.__all__:
        assert hasattr(otel_replay, name), name
        obj = getattr(otel_replay, name)
        if isinstance(obj, type) or inspect.isfunction(obj):
            assert obj.__doc__, f"{name} has no docstring"


def test_every_attribute_the_sql_reads_is_defined_in_semconv():
    defined = {v for k, v in vars(sc).items() if k.isupper() and isinstance(v, str)}
    used = set()
    for path in QUERIES.rglob("*.sql"):
        used |= set(re.findall(r"""\$\."([a-z_.]+)"'""", path.read_text()))
    assert used, "no attribute paths found in queries/"
    assert used <= defined, used - defined


def test_exporter_is_importable_from_the_package():
    from otel_replay.exporters import ParquetSpanExporter

    assert ParquetSpanExporter is otel_replay.ParquetSpanExporter


def test_docs_error_tree_is_the_module_tree():
    """The manual's error page shows exactly the tree errors.py documents, and every exported class is in it."""
    import importlib.util

    import otel_replay.errors as errors

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("otel_replay_docs_hooks", root / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    shown = hooks.errors_reference().split("```text\n", 1)[1].split("```", 1)[0].strip()
    documented = errors.__doc__.split("::\n\n", 1)[1].split("\n\nForeign", 1)[0]
    documented = "\n".join(line[4:] for line in documented.splitlines()).replace("``", "").strip()
    assert shown == documented
    names = set(re.findall(r"[─ ]([A-Z][A-Za-z]+)\s", shown + " ")) | {"OtelReplayError"}
    exported = {n for n in errors.__all__ if isinstance(getattr(errors, n), type)}
    assert exported <= names, exported - names


def test_every_error_survives_pickling_with_its_fields():
    """Errors cross process boundaries (the receiver's converter pool): each comes back whole, of its own class."""
    import pickle

    from otel_replay import errors as e

    samples = [
        e.PartialWriteError(["spans/date=2026-01-01/a.parquet", "s3://b/p/spans/x.parquet"], ["2026-01-01"]),
        e.CorruptFileError("/d/spans/x.parquet", "bad page"),
        e.RecordingError("lost", "rec-1", record={"k": 1}),
        e.Overloaded("busy", 7, unavailable=True),
        e.DeterminismLeakError("leak", step=3, call="time.time"),
        e.ConfigError("bad value for OTEL_REPLAY_X"),
    ]
    for error in samples:
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error) and str(back) == str(error) and back.args == error.args
        assert vars(back) == vars(error)
