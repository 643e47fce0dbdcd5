"""Nothing secret is written in clear: bodies that are not UTF-8, capped JSON heads (rev-rr2 finding 3)."""

from __future__ import annotations

import base64
import json
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest

from otel_replay.rerun import rerun

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
