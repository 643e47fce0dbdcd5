"""No secret of the corpus is stored anywhere: every write path, every stored byte (issue 19, finding 4 and 7).

One run writes the corpus through each path a secret can take: content capture on (a real ``openai``
client against a scripted local server, with ``extra_headers``), the recording of HTTP (URL query, body,
response headers and body), of tool arguments and a tool's exception, of a model call's arguments and
its error, and the run's outcome. Then every file of the dataset is read back, raw and column by column,
with the logs, and no corpus value may appear.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import httpx
import openai
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import otel_replay
from otel_replay.instrumentation import OpenAIInstrumentor, tool
from otel_replay.instrumentation import scripted as s
from otel_replay.query.store import Store
from otel_replay.rerun import recording
from otel_replay.rerun.load import load_recording

NAMED: list[tuple[str, str]] = [
    ("db_password", "zqc01dbpw"),
    ("new_password", "zqc02newpw"),
    ("aws_secret_access_key", "zqc03awssak"),
    ("clientSecret", "zqc04clientsecret"),
    ("secret_key", "zqc05secretkey"),
    ("api_secret", "zqc06apisecret"),
    ("session_id", "zqc07session"),
    ("access_token", "zqc08accesstoken"),
    ("passphrase", "zqc09passphrase"),
    ("privateKey", "zqc10privatekey"),
    ("SIGNING-KEY", "zqc11signingkey"),
    ("auth.credential", "zqc12credential"),
]
"""A secret under a name: (name, value)."""
SHAPES: list[tuple[str, str, str]] = [
    ("openai key", "sk-proj-zqc13abcdefghijklmnopqrst", "zqc13abcdefghijklmnopqrst"),
    ("anthropic key", "sk-ant-api03-zqc14abcdefghijklmnop", "zqc14abcdefghijklmnop"),
    ("aws key id", "AKIAZQC1500000000000", "AKIAZQC1500000000000"),
    ("google key", "AIzaZQC16" + "x" * 30, "AIzaZQC16" + "x" * 30),
    ("github token", "ghp_ZQC17" + "a" * 31, "ZQC17" + "a" * 31),
    ("slack token", "xoxb-ZQC18-1234567890", "ZQC18-1234567890"),
    ("jwt", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ6cWMxOSJ9.zqc19signatureXYZ", "zqc19signatureXYZ"),
    ("pem", "-----BEGIN RSA PRIVATE KEY-----\nZQC20pemBODYabc\n-----END RSA PRIVATE KEY-----", "ZQC20pemBODYabc"),
    ("postgres url", "postgres://app:zqc21pgpw@db.internal:5432/app", "zqc21pgpw"),
    ("mongodb+srv url", "mongodb+srv://app:zqc22mongo@c0.example.net/db", "zqc22mongo"),
    ("ado string", "Server=tcp:db,1433;User Id=sa;Password=zqc23ado;Encrypt=true", "zqc23ado"),
    ("azure string", "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=zqc24azure==;X=y", "zqc24azure"),
    ("bearer", "Authorization: Bearer zqc25bearerTOKEN", "zqc25bearerTOKEN"),
    ("card spaced", "card 4012 8888 8888 1881 on file", "4012 8888 8888 1881"),
    ("card plain", "pan 5105105105105100", "5105105105105100"),
]
"""A secret by its shape: (what, text holding it, the secret in it)."""
HEADER = ("Ocp-Apim-Subscription-Key", "zqc26ocpapim")
QUERY = ("api_key", "zqc27querykey")
RESPONSE_HEADERS = {"Set-Cookie": "sid=zqc28cookie; Path=/; HttpOnly", "X-Auth-Token": "zqc29authtoken"}

SECRETS = [value for _, value in NAMED] + [secret for *_, secret in SHAPES]
SECRETS += [HEADER[1], QUERY[1], "zqc28cookie", "zqc29authtoken", "4012888888881881"]
FORM = dict(NAMED)
NOTE = " | ".join(text for _, text, _ in SHAPES)
PAIRS = " ".join(f"{name}={value}" for name, value in NAMED)


def _agent(api: s.ScriptedServer, model: s.ScriptedServer, provider: Any) -> None:
    @tool(capture_content=True, tracer_provider=provider)
    def submit(form: dict[str, str], note: str) -> str:
        return "submitted"

    @tool(capture_content=True, tracer_provider=provider)
    def explode(reason: str) -> None:
        raise RuntimeError(f"could not file: {reason} {PAIRS}")

    submit(FORM, NOTE)
    try:
        explode(NOTE)
    except RuntimeError:
        pass
    with httpx.Client() as client:
        client.post(f"{api.root_url}/forms?{QUERY[0]}={QUERY[1]}&q=ok", json={"form": FORM, "note": NOTE})
    prompt = [{"role": "user", "content": f"{NOTE} {PAIRS}"}]
    with openai.OpenAI(base_url=model.base_url, api_key="sk-test-key", max_retries=0) as oai:
        oai.chat.completions.create(model="gpt-test", messages=prompt, extra_headers=dict([HEADER]))
        try:
            oai.chat.completions.create(model="gpt-test", messages=prompt)
        except openai.BadRequestError:
            pass
    raise RuntimeError(f"run failed: {NOTE} {PAIRS}")


def _stored_text(dataset: Path) -> tuple[str, list[Path]]:
    """Every stored byte: each file raw (uncompressed text shows), and each Parquet column as text."""
    parts: list[str] = []
    files = [path for path in sorted(dataset.rglob("*")) if path.is_file()]
    for path in files:
        parts.append(path.read_bytes().decode("utf-8", "replace"))
        if path.suffix == ".parquet":
            table = pq.read_table(path)
            for name in table.column_names:
                parts.append(_as_text(table.column(name)))
    return "\n".join(parts), files


def _as_text(column: pa.ChunkedArray | pa.Array) -> str:
    """A column as text, every nested list and struct field opened, every leaf cast to string."""
    if isinstance(column, pa.ChunkedArray):
        return "\n".join(_as_text(chunk) for chunk in column.chunks)
    kind = column.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_map(kind):
        return _as_text(column.flatten())
    if pa.types.is_struct(kind):
        return "\n".join(_as_text(column.field(i)) for i in range(kind.num_fields))
    if pa.types.is_timestamp(kind):
        column = column.cast(pa.int64())
    return "\n".join(value or "" for value in column.cast(pa.string()).to_pylist())


def _found(text: str) -> list[str]:
    return [secret for secret in SECRETS if secret in text or json.dumps(secret)[1:-1] in text]


def test_no_corpus_secret_is_stored_on_any_write_path(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.DEBUG)
    dataset = tmp_path / "traces"
    telemetry = otel_replay.configure(dataset, service_name="corpus", set_global=False)
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=telemetry.provider, capture_content=True)
    try:
        with s.ScriptedServer() as api, s.ScriptedServer() as model:
            api.enqueue(s.Reply(200, {"echo": FORM, "note": NOTE}, headers=RESPONSE_HEADERS))
            model.enqueue(
                s.chat_completion(f"{NOTE} {PAIRS}", tool_calls=[("call_1", "submit", {"form": FORM, "note": NOTE})]),
                s.error(400, f"rejected {NOTE} {PAIRS}"),
            )
            with pytest.raises(RuntimeError, match="run failed"), recording("corpus"):
                _agent(api, model, telemetry.provider)
            assert len(model.requests) == 2
            sent = {k.lower(): v for k, v in model.requests[0]["headers"].items()}
            assert sent[HEADER[0].lower()] == HEADER[1]  # the server did get the real header
        telemetry.force_flush()
    finally:
        instrumentor.uninstrument()
        telemetry.shutdown()

    stored, files = _stored_text(dataset)
    assert any(path.suffix == ".parquet" for path in files)
    # Each path was written (so an absent secret means redacted, not lost) ...
    for written in ("execute_tool submit", "execute_tool explode", "chat gpt-test", "replay.recording"):
        assert written in stored, written
    with Store(dataset) as store:
        recorded = load_recording(store, "corpus")
    assert {event.boundary for event in recorded.events} >= {"http", "tool", "model"}
    assert any(event.error is not None for event in recorded.events)
    assert "raised builtins:RuntimeError" in recorded.outcome
    assert "[REDACTED]" in stored and "run failed" in stored and "could not file" in stored
    # ... and no corpus value is anywhere in it, nor in the logs.
    assert _found(stored) == []
    ours = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("otel_replay"))
    assert _found(ours) == []  # (httpx's own debug log shows the request: not ours to redact)
