"""``import otel_replay`` loads the capture path only; every other public name is imported on first use."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest

import otel_replay

# What ``import otel_replay`` must not load: the read side and DuckDB, the gate's reads, rerun, contracts,
# the instrumentors, the report pages, the receiver and gRPC, compaction.
NOT_AT_IMPORT = [
    "duckdb",
    "grpc",
    "yaml",
    "jsonschema",
    "pyarrow.dataset",
    "opentelemetry.instrumentation",
    "otel_replay.query.store",
    "otel_replay.query.chains",
    "otel_replay.gate.gate",
    "otel_replay.gate.execute",
    "otel_replay.contracts",
    "otel_replay.rerun",
    "otel_replay.instrumentation.tools",
    "otel_replay.report",
    "otel_replay.server",
    "otel_replay.storage.compact",
    "otel_replay.cli",
]

# What a bare ``import otel_replay`` loads, and nothing more: what ``import otel_replay.X`` pays before X. Not the
# capture path (the OpenTelemetry SDK, pyarrow, protobuf, the recorder, the exporter), which ``from otel_replay import
# audit`` loads on first use, and not click or rich, which the CLI loads.
AT_BARE_IMPORT = [
    "otel_replay",
    "otel_replay._compaction",
    "otel_replay._counters",
    "otel_replay._display",
    "otel_replay._lazy",
    "otel_replay._version",
]
NOT_AT_BARE_IMPORT = [
    "opentelemetry",
    "google.protobuf",
    "pyarrow",
    "click",
    "rich",
    *NOT_AT_IMPORT,
]

LAZY_PACKAGES = [
    "otel_replay",
    "otel_replay.capture",
    "otel_replay.exporters",
    "otel_replay.gate",
    "otel_replay.contracts",
    "otel_replay.rerun",
    "otel_replay.server",
    "otel_replay.storage",
    "otel_replay.instrumentation",
]


def _fresh(code: str) -> Any:
    """Run ``code`` in a new interpreter; it prints one JSON value, returned here."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_the_package_loads_the_capture_path_and_none_of_the_rest() -> None:
    seen = _fresh(
        f"""
        import json, sys
        import otel_replay
        from otel_replay import configure, audit, AuditLog, DecisionTracer, ConfigError
        print(json.dumps([name for name in {NOT_AT_IMPORT!r} if name in sys.modules]))
        """
    )
    assert seen == []


def test_a_bare_import_loads_the_package_root_and_not_the_capture_path() -> None:
    found = _fresh(
        f"""
        import json, sys
        import otel_replay
        ours = sorted(name for name in sys.modules if name == "otel_replay" or name.startswith("otel_replay."))
        print(json.dumps([ours, [name for name in {NOT_AT_BARE_IMPORT!r} if name in sys.modules]]))
        """
    )
    assert found == [AT_BARE_IMPORT, []]


def test_every_public_name_resolves_on_first_use_to_the_object_its_module_defines() -> None:
    found = _fresh(
        """
        import json, sys
        import otel_replay
        listed = set(dir(otel_replay))
        missing = [n for n in otel_replay.__all__ if n not in listed]
        kinds = {n: type(getattr(otel_replay, n)).__name__ for n in otel_replay.__all__}
        store = "otel_replay.query.store" in sys.modules
        print(json.dumps({"missing_from_dir": missing, "kinds": kinds, "store": store}))
        """
    )
    assert found["missing_from_dir"] == []
    assert set(found["kinds"]) == set(otel_replay.__all__)
    # In __all__'s order ``recording`` comes first and imports the package ``otel_replay.rerun``: ``rerun`` stays the
    # function all the same, as every name stays what it was (a constant, a class, a function; never a module).
    assert found["kinds"]["rerun"] == "function"
    assert "module" not in found["kinds"].values()
    assert found["store"]  # what was used is now imported
    assert otel_replay.open is importlib.import_module("otel_replay.query.store").open_store
    assert otel_replay.Store is importlib.import_module("otel_replay.query.store").Store


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_a_lazy_package_gives_each_name_in_all_from_its_module_and_lists_it(package: str) -> None:
    module = importlib.import_module(package)
    for name in module.__all__:
        value = getattr(module, name)
        assert value is not None, name
        defining = getattr(value, "__module__", None)
        if isinstance(defining, str) and defining.startswith(package) and hasattr(sys.modules[defining], name):
            assert getattr(sys.modules[defining], name) is value, (package, name)
        assert name in dir(module), (package, name)


@pytest.mark.parametrize("package", LAZY_PACKAGES)
@pytest.mark.parametrize("name", ["no_such_name", "__wrapped__", "_LAZY_", "Store ", "../etc", "gate.gate"])
def test_an_unknown_name_is_an_attribute_error_naming_it(package: str, name: str) -> None:
    module = importlib.import_module(package)
    with pytest.raises(AttributeError, match="has no attribute"):
        getattr(module, name)
    assert not hasattr(module, name)


def test_from_import_of_an_unknown_name_is_an_import_error() -> None:
    with pytest.raises(ImportError, match="cannot import name 'no_such_name'"):
        exec("from otel_replay import no_such_name", {})


def test_a_subpackage_is_reachable_from_a_bare_import_as_before() -> None:
    found = _fresh(
        """
        import json
        import otel_replay
        print(json.dumps([otel_replay.storage.compact.__name__, otel_replay.gate.ActionGate.__name__,
                          otel_replay.query.store.Store.__name__]))
        """
    )
    assert found == ["compact", "ActionGate", "Store"]


def test_a_function_named_like_a_module_stays_the_function_whichever_is_imported_first() -> None:
    found = _fresh(
        """
        import json
        import otel_replay.storage.compact
        import otel_replay.contracts.backtest
        import otel_replay.rerun.runner
        from otel_replay.storage import compact
        from otel_replay.contracts import backtest
        from otel_replay import recording, rerun
        import otel_replay.storage as storage
        print(json.dumps([compact.__module__, backtest.__module__, rerun.__module__, recording.__module__,
                          storage.compact is compact, callable(compact) and callable(backtest) and callable(rerun)]))
        """
    )
    assert found == [
        "otel_replay.storage.compact",
        "otel_replay.contracts.backtest",
        "otel_replay.rerun.runner",
        "otel_replay.rerun.record",
        True,
        True,
    ]


def test_a_verdict_in_a_notebook_shows_its_report_page_after_a_bare_import() -> None:
    found = _fresh(
        """
        import json, sys
        import otel_replay
        verdict = otel_replay.Verdict(otel_replay.FixAction.ROLLBACK, False, "over <b>budget</b>", "rec-1")
        before = "otel_replay.report" in sys.modules
        shown = verdict._repr_html_()
        print(json.dumps([before, shown]))
        """
    )
    before, shown = found
    assert before is False
    assert "<iframe" in shown and "ROLLBACK" in shown
    assert "<b>budget</b>" not in shown  # escaped, as on every page


def test_an_exporter_that_compacts_gets_the_background_compactor_without_importing_storage_first(tmp_path) -> None:
    found = _fresh(
        f"""
        import json, sys
        import otel_replay
        from otel_replay.exporters import ParquetSpanExporter
        before = "otel_replay.storage.compact" in sys.modules
        exporter = ParquetSpanExporter({str(tmp_path / "ds")!r}, compact_every_seconds=3600)
        kind = type(exporter._compactor).__name__
        exporter.shutdown()
        print(json.dumps([before, kind]))
        """
    )
    assert found == [False, "BackgroundCompactor"]
