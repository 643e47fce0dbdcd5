"""Nothing is written in clear: bodies not UTF-8, capped JSON heads, tool arguments, errors (rev-rr2 3-5)."""

from __future__ import annotations

import base64
import dataclasses
import json
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest

import otel_replay
from otel_replay.instrumentation import tool
from otel_replay.query.store import Store
from otel_replay.rerun import recording, rerun
from otel_replay.rerun.codec import arguments_codec
from otel_replay.rerun.http_match import request_arguments
from otel_replay.rerun.load import load_recording

from .conftest import record
from .test_rerun_http import _reply, _server, _stored_events

_KEY = "sk-proj-" + "Q" * 40
_SID = "a8f5f167f44f4964e6c998dee827110c"
_CJK = json.dumps({"access_token": _KEY, "notes": "\u6587" * 3000}, ensure_ascii=False).encode()
_LATIN = json.dumps({"access_token": _KEY, "name": "M\u00fcller"}, ensure_ascii=False).encode("latin-1")
_LATIN_REDACTED = {"access_token": "[REDACTED]", "name": "M\u00fcller"}
_BIG = json.dumps({"session_id": _SID, "password": "correct horse battery staple", "rows": ["x" * 50] * 200}).encode()
_PNG = bytes(range(256)) * 8


def _answer(h: BaseHTTPRequestHandler) -> None:
    body = {"/cjk": _CJK, "/latin1": _LATIN, "/big": _BIG}.get(h.path, b'{"text": "hello"}')
    _reply(h, 200, body, [("Content-Type", "application/json")])


def _calls(base: str) -> list[Any]:
    with httpx.Client() as client:
        out: list[Any] = [client.get(f"{base}{path}").content for path in ("/cjk", "/latin1", "/big")]
        fixed = {"Content-Type": "multipart/form-data; boundary=b0undary"}  # httpx's own is random per run
        upload = client.post(f"{base}/ocr", data={"apikey": _KEY}, files={"file": ("scan.png", _PNG)}, headers=fixed)
        out.append(upload.json())
    return out


def _stored_bytes(body: Any) -> bytes:
    return base64.b64decode(body["$b64"]) if isinstance(body, dict) else str(body).encode()


def test_bodies_that_are_not_utf8_or_are_capped_are_stored_redacted(
    dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_REPLAY_RERUN_MAX_BODY", "4096")  # the CJK body is cut inside a character
    with _server(_answer) as base:
        original, _, _ = record(dataset, "clear", lambda: _calls(base))
        assert original[0] == _CJK and original[1] == _LATIN  # recording changes nothing the agent sees
        stored = "".join(str(pq.read_table(p, columns=["attributes"]).to_pylist()) for p in dataset.rglob("*.parquet"))
        assert "QQQQQQQQ" not in stored
        cjk, latin, big, upload = _stored_events(dataset, "clear")
        for event in (cjk, latin):
            body = _stored_bytes(event["value"]["body"])
            assert _KEY.encode() not in body and b"[REDACTED]" in body
        assert json.loads(_stored_bytes(latin["value"]["body"]).decode("latin-1")) == _LATIN_REDACTED  # the rest kept
        head = big["value"]["body"]  # a capped JSON head: no longer parses, redacted by key name as well
        assert _SID not in head and "horse" not in head and '"session_id":"[REDACTED]"' in head.replace(" ", "")
        request = _stored_bytes(json.loads(upload["arguments"])["body"])
        assert _KEY.encode() not in request and _PNG[:200] in request  # the file's bytes are kept, the key is not
        result = rerun(lambda: _calls(base), dataset=dataset, session_id="clear")
    assert result.divergence is not None and "capped" in result.divergence.reason  # the cut CJK body, named
    assert result.output[3] == {"text": "hello"}
    assert json.loads(result.output[1].decode("latin-1")) == _LATIN_REDACTED  # Latin-1 still, the key redacted


def test_an_upload_whose_body_is_not_utf8_matches_with_its_key_redacted_on_both_sides(dataset: Path) -> None:
    with _server(_answer) as base:
        original, _, _ = record(dataset, "upload", lambda: _calls(base)[1:])
        request = _stored_bytes(json.loads(_stored_events(dataset, "upload")[3]["arguments"])["body"])
        assert _KEY.encode() not in request and b"[REDACTED]" in request
        result = rerun(lambda: _calls(base)[1:], dataset=dataset, session_id="upload", governance="strict")
    assert result.matched and result.output[2] == original[2] == {"text": "hello"}, result.report()


# --- findings 4 and 5: tool arguments, error messages and outcomes are stored redacted -----------


@dataclasses.dataclass(frozen=True)
class DbLogin:
    user: str
    password: str


_GH = "ghp_" + "T" * 36
PASSWORD = ["hunter2-Very-Secret!"]


@tool
def connect(login: DbLogin, token: str) -> str:
    """Connects with credentials passed as arguments."""
    return "connected"


@tool
def search(q: str) -> str:
    """Fails naming the URL with its key, as raise_for_status() does."""
    raise ValueError(f"Client error '404 Not Found' for url 'https://api.x/v1/search?q={q}&api_key={_KEY}'")


def _connects() -> str:
    return connect(DbLogin("svc", PASSWORD[0]), token=_GH)


def _searches() -> str:
    return search("acme")


def _stored_recording(dataset: Path, session_id: str) -> Any:
    with Store(dataset) as store:
        return load_recording(store, session_id)


def test_tool_arguments_are_stored_redacted_and_matched_on_their_unredacted_hash(dataset: Path) -> None:
    record(dataset, "login", _connects)
    (event,) = _stored_recording(dataset, "login").events
    assert PASSWORD[0] not in event.arguments and _GH not in event.arguments
    assert '"password":"[REDACTED]"' in event.arguments and '"token":"[REDACTED]"' in event.arguments
    assert rerun(_connects, dataset=dataset, session_id="login", governance="strict").matched
    PASSWORD[0] = "another-password-entirely"  # differs only in a secret: still another argument
    try:
        other = rerun(_connects, dataset=dataset, session_id="login")
    finally:
        PASSWORD[0] = "hunter2-Very-Secret!"
    assert not other.matched and other.divergence is not None and "other arguments" in other.divergence.reason
    assert "another-password" not in other.report() and "hunter2" not in other.report()


def test_error_messages_and_the_outcome_are_stored_redacted(dataset: Path) -> None:
    telemetry = otel_replay.configure(dataset, service_name="rerun-tests", set_global=False)
    try:
        with pytest.raises(ValueError, match="QQQQ"), recording("failed"):
            _searches()  # the agent itself still sees the real message
        telemetry.force_flush()
    finally:
        telemetry.shutdown()
    stored = _stored_recording(dataset, "failed")
    (event,) = stored.events
    assert (
        event.error is not None
        and _KEY not in event.error["message"]
        and "api_key=[REDACTED]" in event.error["message"]
    )
    assert stored.outcome.startswith("raised builtins:ValueError:") and _KEY not in stored.outcome
    assert "api_key=[REDACTED]" in stored.outcome
    result = rerun(_searches, dataset=dataset, session_id="failed", governance="strict")
    assert result.matched and result.error is not None and "api_key=[REDACTED]" in result.error, result.report()


_BODY = b'{"clientSecret":"zq3","db_password":"zq4","card":"4111 1111 1111 1111","password":"zq5"}'
_URL = "https://api.example/v1/token?subscription-key=zq1&api_key=zq2"
# What the code before the one engine stored and hashed for this request (format 2 matched HTTP redacted).
_AS_FORMAT_2 = (
    '{"body":"{\\"clientSecret\\":\\"zq3\\",\\"db_password\\":\\"zq4\\",\\"card\\":\\"4111 1111 1111 1111\\",'
    '\\"password\\":\\"[REDACTED]\\"}","method":"POST",'
    '"url":"https://api.example/v1/token?subscription-key=[REDACTED]&api_key=[REDACTED]"}'
)


def test_a_format_2_rerun_redacts_http_arguments_by_the_rules_it_was_recorded_with() -> None:
    """A format-2 recording's HTTP steps were matched on their redacted text: the same text, so they still match."""
    with arguments_codec(2):
        assert request_arguments("post", _URL, _BODY) == _AS_FORMAT_2
    now = request_arguments("post", _URL, _BODY)
    assert not any(value in now for value in ("zq1", "zq2", "zq3", "zq4", "zq5", "1111"))
