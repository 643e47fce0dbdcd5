"""The exporter and DatasetWriter write an s3:// dataset; Store, `otel-replay chain` and `sql` read it."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

import otel_replay
import otel_replay.errors
import otel_replay.location
from otel_replay.errors import ConfigError, DatasetError
from otel_replay.exporters import ParquetSpanExporter
from otel_replay.location import register_with, resolve
from otel_replay.query.store import Store

from .._support import Zygote
from .conftest import keys

ROOT = Path(__file__).resolve().parents[2]


def _cli(zygote: Zygote, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m otel_replay *args`` in a process of its own (forked with the package imported)."""
    return zygote.cli(*args, env=dict(os.environ, PYTHONPATH=str(ROOT)))


def test_exporter_writes_spans_to_s3_and_store_reads_them(bucket: str, s3: Any) -> None:
    uri = f"s3://{bucket}/team/traces"
    exporter = ParquetSpanExporter(uri, max_age_seconds=60)
    provider = TracerProvider(resource=Resource.create({"service.name": "s3-test"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    for i in range(50):
        with tracer.start_as_current_span(f"op-{i}") as span:
            span.set_attribute("i", i)
    assert exporter.force_flush()
    provider.shutdown()
    assert exporter.stats.rows_written == 50 and exporter.stats.rows_dropped == 0
    stored = keys(s3, bucket, "team/traces/")
    assert stored and all(k.startswith("team/traces/spans/date=") and k.endswith(".parquet") for k in stored)
    assert not [k for k in stored if ".tmp" in k]  # one PUT per file: no temp objects
    with Store(uri) as store:
        assert len(store.files) == len(stored) and all(f.startswith(f"s3://{bucket}/") for f in store.files)
        rows = store.rows("SELECT count(*) AS n, count(DISTINCT name) AS names, min(service_name) AS s FROM spans")
        assert rows == [{"n": 50, "names": 50, "s": "s3-test"}]
        # the analyst sandbox still refuses everything but the dataset's files
        with pytest.raises(otel_replay.errors.ReadOnlyViolation):
            store.query("SELECT * FROM read_text('/etc/hostname')")


_RECORD = """
import sys
from datetime import UTC, datetime, timedelta
import otel_replay
import otel_replay.errors
from otel_replay import AuditLog, DecisionTracer, correlation
T0 = datetime(2026, 3, 2, 14, 30, tzinfo=UTC)
telemetry = otel_replay.configure(sys.argv[1], service_name="desk", set_global=False)
log, tracer = AuditLog(), DecisionTracer()
with correlation("trade-1"):
    log.append("signal_received", source_agent="router", created_at=T0)
    log.append("evaluation_sent", source_agent="foresight", created_at=T0 + timedelta(seconds=1))
    first = tracer.decision("foresight", "signal_evaluation", "bullish", 0.74, {"signal": "S1"})
    second = tracer.decision("sizer", "position_sizing", "1.4x", 0.68, {"mult": 1.4})
with correlation("trade-2"):
    log.append("unrelated", source_agent="x", created_at=T0)
tracer.record_outcome(second, False)
telemetry.force_flush()
telemetry.shutdown()
print(first, second)
"""


def _chain(zygote: Zygote, dataset: str, cid: str) -> dict[str, Any]:
    done = _cli(zygote, "chain", "trade", cid, "--dataset", dataset, "--json")
    assert done.returncode == 0, done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def _strip_files(value: Any) -> Any:
    """The chain with file names and ids that differ between two recordings taken out."""
    if isinstance(value, dict):
        return {k: _strip_files(v) for k, v in value.items() if k not in ("filename", "file")}
    if isinstance(value, list):
        return [_strip_files(v) for v in value]
    return value


@pytest.mark.slow
def test_trade_chain_and_sql_through_the_cli_on_s3(bucket: str, tmp_path: Path, zygote: Zygote) -> None:
    uri = f"s3://{bucket}/desk"
    recorded = zygote.run(_RECORD, uri, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert recorded.returncode == 0, recorded.stderr
    first, second = recorded.stdout.split()
    chain = _chain(zygote, uri, "trade-1")
    text = json.dumps(chain)
    assert first in text and second in text and "signal_received" in text and "unrelated" not in text
    done = _cli(zygote, "sql", "SELECT count(*) AS n FROM decisions", "--dataset", uri, "--format", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) in ({"n": 2}, [{"n": 2}])
    verified = _cli(zygote, "verify", "--dataset", uri)
    assert verified.returncode == 0, verified.stdout + verified.stderr


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("gs://bucket/x", "unsupported scheme 'gs'"),
        ("s3://", "no bucket"),
        ("s3:///prefix", "no bucket"),
        ("s3://Bad_Bucket/x", "not a valid S3 bucket name"),
        ("s3://bucket/../x", "may not hold"),
        ("file://relative/x", "absolute path"),
    ],
)
def test_bad_uris_fail_in_one_line_naming_the_uri(uri: str, message: str, zygote: Zygote) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve(uri)
    assert uri in str(caught.value) and message in str(caught.value) and "\n" not in str(caught.value)
    done = _cli(zygote, "sql", "SELECT 1", "--dataset", uri)
    assert done.returncode == 1 and uri in done.stderr and message in done.stderr
    assert "Traceback" not in done.stderr


def test_missing_bucket_unreachable_endpoint_and_no_credentials(
    bucket: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, aws_env: str, zygote: Zygote
) -> None:
    with pytest.raises(DatasetError, match=r"bucket 'no-such-bucket-here' does not exist"):
        ParquetSpanExporter("s3://no-such-bucket-here/x")
    done = _cli(zygote, "sql", "SELECT 1", "--dataset", "s3://no-such-bucket-here/x")
    assert done.returncode == 1 and "s3://no-such-bucket-here/x" in done.stderr and "does not exist" in done.stderr
    import socket

    with socket.socket() as sock:  # a loopback port nobody listens on
        sock.bind(("127.0.0.1", 0))
        dead = sock.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{dead}")
    with pytest.raises(DatasetError, match=rf"s3://{bucket}/x: cannot reach the S3 endpoint http://127.0.0.1:{dead}"):
        Store(f"s3://{bucket}/x")
    monkeypatch.setenv("AWS_ENDPOINT_URL", aws_env)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(DatasetError, match=rf"s3://{bucket}/x: no AWS credentials found"):
        ParquetSpanExporter(f"s3://{bucket}/x")


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("AWS_ENDPOINT_URL", "not a url"),  # was: "Invalid DNS Label found in URI host" at the first request
        ("AWS_ENDPOINT_URL", "ftp://minio:9000"),  # was: "cannot reach the S3 endpoint", naming no variable
        ("AWS_ENDPOINT_URL_S3", "http://minio :9000"),
    ],
)
def test_a_malformed_endpoint_variable_fails_at_resolve_naming_it(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as info:
        resolve("s3://some-bucket/x")
    assert str(info.value) == f"{variable}={value!r} must be an http:// or https:// URL (an S3-compatible server)"


def test_a_blank_endpoint_or_region_variable_is_unset(monkeypatch: pytest.MonkeyPatch, aws_env: str) -> None:
    """As the AWS SDKs read them: a blank AWS_ENDPOINT_URL_S3 falls through to AWS_ENDPOINT_URL (was: used as ' ')."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", " ")
    monkeypatch.setenv("AWS_REGION", " ")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    assert otel_replay.location.s3_endpoint() == aws_env
    assert otel_replay.location._region() == "eu-west-1"


def test_writers_sharing_a_prefix_never_overwrite_each_other(bucket: str, s3: Any) -> None:
    """Many receivers, one dataset: every writer's files have names of their own."""
    import pyarrow as pa

    from otel_replay.exporters.rows import spans_to_table  # noqa: F401  (the writer's input format)
    from otel_replay.exporters.writer import DatasetWriter

    uri = f"s3://{bucket}/shared"
    local_rows = _sample_rows()
    writers = [DatasetWriter(uri, max_rows=10**6, max_age_seconds=3600) for _ in range(4)]
    for _ in range(3):
        for writer in writers:
            writer.append(local_rows)
            writer.flush()
    for writer in writers:
        writer.close()
    names = keys(s3, bucket, "shared/spans/")
    assert len(names) == 12 == len(set(names))
    assert sum(pq.ParquetFile(resolve(uri).fs.open_input_file(f"{bucket}/{k}")).metadata.num_rows for k in names) == (
        12 * local_rows.num_rows
    )
    with Store(uri) as store:
        assert store.rows("SELECT count(*) AS n FROM spans") == [{"n": 12 * local_rows.num_rows}]
    assert isinstance(local_rows, pa.Table)


def _sample_rows() -> Any:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otel_replay.exporters.rows import spans_to_table

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    for i in range(7):
        with provider.get_tracer("t").start_as_current_span(f"s{i}"):
            pass
    provider.shutdown()
    return spans_to_table(memory.get_finished_spans())


class _Connection:
    """Stands in for a DuckDB connection: keeps the filesystem :func:`register_with` gives DuckDB."""

    fs: Any = None

    def register_filesystem(self, fs: Any) -> None:
        self.fs = fs


_READERS = 4


@pytest.mark.parametrize(("blocks", "rounds"), [(False, 200), (True, 40)], ids=["whole-object", "cached-blocks"])
def test_threads_sharing_one_object_handle_each_read_the_bytes_at_their_own_position(
    bucket: str, s3: Any, monkeypatch: pytest.MonkeyPatch, blocks: bool, rounds: int
) -> None:
    """DuckDB's threads share one handle per object and read by ``seek`` then ``read``: no read lands elsewhere.

    The handle is read here as DuckDB reads it, from several threads at once: in each round every thread seeks
    to an offset of its own, all wait until all have sought, then all read (the interpreter switching threads
    every microsecond). DuckDB 2.0 happens to serialise each seek-and-read pair on a handle, so a query over the
    dataset passed even with a handle that mixed positions up: it could not show this.
    """
    from otel_replay import location as loc_module

    data = random.Random(7).randbytes(64 * 1024)
    s3.put_object(Bucket=bucket, Key="obj", Body=data)
    if blocks:  # fetched in 4 KiB blocks (a read spans up to four) through a cache that keeps half of them
        monkeypatch.setattr(loc_module, "WHOLE_OBJECT_BYTES", 0)
        monkeypatch.setattr(loc_module, "BLOCK_BYTES", 4096)
        monkeypatch.setattr(loc_module, "OBJECT_CACHE_BYTES", 8 * 4096)
    con = _Connection()
    register_with(con, resolve(f"s3://{bucket}/x"))
    handle = con.fs.open(f"s3://{bucket}/obj", "rb")
    assert handle.size == len(data)
    wrong: list[str] = []
    sought = threading.Barrier(_READERS, timeout=60)

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(rounds):
                offset, n = rng.randrange(len(data)), rng.randrange(1, 12_000)
                handle.seek(offset)
                sought.wait()  # every thread has moved "the" position since this one did
                if rng.random() < 0.5:
                    got = handle.read(n)
                else:
                    buffer = bytearray(n)
                    got = bytes(buffer[: handle.readinto(buffer)])
                if got != data[offset : offset + n] or handle.tell() != offset + len(got):
                    wrong.append(f"{len(got)} bytes at {offset}, then position {handle.tell()}: not the object's")
                    sought.abort()
                    return
        except threading.BrokenBarrierError:
            pass  # another reader went wrong and said so
        except BaseException as exc:  # reported in the test's thread
            wrong.append(repr(exc))
            sought.abort()

    threads = [
        threading.Thread(target=reader, args=(seed,), name=f"s3-handle-reader-{seed}") for seed in range(_READERS)
    ]
    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # a thread switch between any two steps of a read, not once in 5 ms
    try:
        for thread in threads:
            thread.start()
    finally:
        for thread in threads:
            thread.join()
        sys.setswitchinterval(switching)
        handle.close()
    assert wrong == []
