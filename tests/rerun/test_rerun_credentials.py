"""Credentials in a rerun: compared by value by default, by presence and scheme only when asked.

And a divergence in a part that is stored redacted (a credential, a secret query value) is named from the
keyed per-part digests the recording holds, never by pointing at a character of two equal texts.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest
from click.testing import CliRunner

from otel_replay.cli.rerun import rerun_command
from otel_replay.errors import ConfigError
from otel_replay.instrumentation.scripted import ScriptedServer, chat_completion
from otel_replay.rerun import rerun
from otel_replay.rerun.runner import RerunResult
from tests._support import Zygote

from .conftest import PYTEST, cli_without_current_directory, record
from .test_rerun_matching import _base_of, _send, _server, _stored_text

ROOT = Path(__file__).resolve().parents[2]
KEY_A = "sk-live-TREASURY-AAAAAAAAAAAAAAAAAAAA"
KEY_B = "sk-live-ESCROW-BBBBBBBBBBBBBBBBBBBBBB"
_CLIENTS = ["httpx", "requests", "urllib3"]
_EXPLAINED = (
    "only a credential header differs (authorization): the rerun sent other credentials than the recorded run; "
    'rerun with the recorded run\'s credentials, or with credentials="presence" (--credentials presence) '
    "to compare credentials by presence only"
)


def _pay(
    client: str, *, auth: str | None = f"Bearer {KEY_A}", account: str = "treasury", amount: int = 5, to: str = "v-7"
) -> Callable[[str], Any]:
    headers = {"X-Account": account, "Content-Type": "application/json"}
    if auth is not None:
        headers["Authorization"] = auth
    body = json.dumps({"amount": amount}).encode()
    return lambda base: _send(client, "POST", f"{base}/pay?to={to}", body=body, headers=headers)


def _recorded(dataset: Path, client: str = "httpx", **how: Any) -> str:
    """Record one payment (``how`` changes it) against a live server; the server's base URL (gone after)."""
    with _server() as (base, _):
        record(dataset, "pay", lambda: _pay(client, **how)(base))
    return _base_of(dataset)


def _rerun(dataset: Path, base: str, agent: Callable[[str], Any], **options: Any) -> RerunResult:
    return rerun(lambda: agent(base), dataset=dataset, session_id="pay", write=False, **options)


# --- a divergence in a redacted part is named -----------------------------------------------------------


def test_a_changed_credential_is_named_not_pointed_at_and_shows_headers_differing(dataset: Path) -> None:
    base = _recorded(dataset)
    result = _rerun(dataset, base, _pay("httpx", auth=f"Bearer {KEY_B}"))
    assert not result.matched and result.divergence is not None, result.report()
    found = result.divergence
    assert found.step == 0 and found.reason.endswith(_EXPLAINED), found.reason
    assert "(the difference is in a redacted value: header authorization)" in found.expected, found.expected
    assert "first difference at character" not in found.expected
    closest = found.candidates[0]
    assert "✓ method ✓ host ✓ path ✓ query ✗ headers ✓ body" in closest, closest
    assert "headers differing: authorization" in closest
    report = result.report()
    assert KEY_A not in report and KEY_B not in report and '"digests"' not in report


def test_a_changed_plain_header_is_named_among_the_matchers_by_name_only(dataset: Path) -> None:
    base = _recorded(dataset)
    result = _rerun(dataset, base, _pay("httpx", account="escrow"))
    assert result.divergence is not None and "credential" not in result.divergence.reason
    closest = result.divergence.candidates[0]
    assert "✗ headers" in closest and "headers differing: x-account" in closest, closest
    assert "escrow" not in closest.partition("[")[2]  # the matchers name the header, never its value


@pytest.mark.parametrize(
    ("change", "mark"),
    [({"amount": 5000}, "✓ headers ✗ body"), ({"to": "v-8"}, "✗ query ✓ headers ✓ body")],
)
def test_a_body_or_query_difference_is_still_marked_on_its_own_matcher(
    dataset: Path, change: dict[str, Any], mark: str
) -> None:
    base = _recorded(dataset)
    for credentials in ("value", "presence"):
        result = _rerun(dataset, base, _pay("httpx", **change), credentials=credentials)
        assert not result.matched and result.divergence is not None, result.report()
        assert mark in result.divergence.candidates[0], result.divergence.candidates
        assert "credential" not in result.divergence.reason


def test_a_secret_query_value_change_is_named_as_the_query(dataset: Path) -> None:
    with _server() as (base, _):
        record(dataset, "pay", lambda: _send("httpx", "GET", f"{base}/balance?api_key={KEY_A}"))
    result = rerun(
        lambda: _send("httpx", "GET", f"{base}/balance?api_key={KEY_B}"), dataset=dataset, session_id="pay", write=False
    )
    assert result.divergence is not None, result.report()
    assert "(the difference is in a redacted value: query)" in result.divergence.expected, result.divergence
    assert "✗ query" in result.divergence.candidates[0]


# --- credentials="presence" ---------------------------------------------------------------------------


@pytest.mark.parametrize("client", _CLIENTS)
def test_presence_matches_a_changed_credential_value_with_the_original_fingerprint(dataset: Path, client: str) -> None:
    with _server() as (base, _):
        _, fingerprint, _ = record(dataset, "pay", lambda: _pay(client)(base))
    result = _rerun(dataset, base, _pay(client, auth=f"Bearer {KEY_B}"), credentials="presence")
    assert result.matched and result.fingerprint == fingerprint == result.original_fingerprint, result.report()
    assert result.credentials == "presence" and "credentials compared by presence only" in result.report()
    by_value = _rerun(dataset, base, _pay(client, auth=f"Bearer {KEY_B}"))
    assert not by_value.matched and by_value.divergence is not None
    assert by_value.divergence.reason.endswith(_EXPLAINED)
    assert "credentials compared by presence only" not in by_value.report()


def test_presence_matches_a_changed_api_key_header(dataset: Path) -> None:
    def call(key: str) -> Callable[[str], Any]:
        return lambda base: _send("httpx", "GET", f"{base}/quote", headers={"X-Api-Key": key})

    with _server() as (base, _):
        record(dataset, "pay", lambda: call(KEY_A)(base))
    assert _rerun(dataset, base, call(KEY_B), credentials="presence").matched
    assert not _rerun(dataset, base, call(KEY_B)).matched


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"auth": None}, "header authorization (recorded, not sent by the rerun)"),
        ({"auth": f"Basic {KEY_B}"}, "header authorization (its scheme: recorded bearer, rerun basic)"),
        ({"auth": KEY_B}, "header authorization (its scheme: recorded bearer, rerun none)"),
        ({"auth": f"Bearer {KEY_B}", "account": "escrow"}, "x-account"),
        ({"auth": f"Bearer {KEY_B}", "amount": 5000}, "body"),
    ],
    ids=["missing", "other-scheme", "no-scheme", "plain-header", "body"],
)
def test_presence_does_not_match_a_missing_credential_another_scheme_or_any_other_change(
    dataset: Path, change: dict[str, Any], says: str
) -> None:
    base = _recorded(dataset)
    result = _rerun(dataset, base, _pay("httpx", **change), credentials="presence")
    assert not result.matched and result.divergence is not None and result.divergence.step == 0, result.report()
    assert "only a credential header differs" not in result.divergence.reason
    shown = result.divergence.expected + result.divergence.candidates[0]
    assert says in shown, shown


def test_an_unknown_auth_scheme_is_never_stored_in_clear(dataset: Path) -> None:
    base = _recorded(dataset, auth=f"{KEY_A} trailing")  # a key first, where a scheme would stand
    assert KEY_A not in _stored_text(dataset)
    result = _rerun(dataset, base, _pay("httpx", auth=f"{KEY_B} trailing"), credentials="presence")
    assert not result.matched and result.divergence is not None
    assert "recorded another, rerun another" in result.divergence.expected, result.divergence.expected


def test_a_credential_only_difference_is_a_divergence_in_strict_mode_too(dataset: Path) -> None:
    from otel_replay.errors import ReplayMismatchError

    base = _recorded(dataset)
    with pytest.raises(ReplayMismatchError, match="only a credential header differs"):
        _rerun(dataset, base, _pay("httpx", auth=f"Bearer {KEY_B}"), governance="strict")
    strict = _rerun(dataset, base, _pay("httpx", auth=f"Bearer {KEY_B}"), governance="strict", credentials="presence")
    assert strict.matched, strict.report()


# --- the real openai client with another api key ------------------------------------------------------


def _openai_agent(server: ScriptedServer, key: str) -> str:
    chat = openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0)
    reply = chat.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "refund o-1?"}])
    return str(reply.choices[0].message.content)


def test_an_openai_agent_recorded_with_one_key_reruns_with_another_only_by_presence(dataset: Path) -> None:
    with ScriptedServer([chat_completion("refund approved")]) as server:
        original, fingerprint, _ = record(dataset, "chat", lambda: _openai_agent(server, KEY_A))
        options: dict[str, Any] = {"dataset": dataset, "session_id": "chat", "write": False}
        presence = rerun(lambda: _openai_agent(server, KEY_B), credentials="presence", **options)
        value = rerun(lambda: _openai_agent(server, KEY_B), **options)
        strict = rerun(lambda: _openai_agent(server, KEY_B), governance="strict", credentials="presence", **options)
    assert original == "refund approved"
    assert presence.matched and presence.output == original and presence.fingerprint == fingerprint, presence.report()
    assert strict.matched, strict.report()
    assert not value.matched and value.divergence is not None
    assert value.divergence.reason.endswith(_EXPLAINED), value.divergence.reason


# --- the option, validated ------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["Presence", "none", "", None, 1, "value\nx", "x" * 10_000])
def test_a_bad_credentials_value_is_a_one_line_config_error_naming_it(dataset: Path, bad: Any) -> None:
    record(dataset, "quiet", lambda: None)
    with pytest.raises(ConfigError) as raised:
        rerun(lambda: None, dataset=dataset, session_id="quiet", credentials=bad)
    message = str(raised.value)
    assert message.startswith("credentials must be 'value' or 'presence', got ") and len(message.splitlines()) == 1
    assert repr(bad)[:20] in message and len(message) < 200, message


def _cli(zygote: Zygote, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -P -m otel_replay *args`` in ``cwd``, a process of its own (a child of the zygote)."""
    return cli_without_current_directory(zygote, cwd, *args, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.slow
def test_the_cli_takes_credentials_says_it_in_json_and_refuses_another_value_in_one_line(
    dataset: Path, tmp_path: Path, zygote: Zygote
) -> None:
    record(dataset, "quiet", lambda: None)
    base = ["rerun", "quiet", "--entrypoint", "gc:enable", "-d", str(dataset)]
    bad = _cli(zygote, tmp_path, *base, "--credentials", "any")
    assert bad.returncode == 1 and "Traceback" not in bad.stderr, bad.stderr
    assert bad.stderr.strip() == "Error: --credentials must be 'value' or 'presence', got 'any'", bad.stderr
    # The rest in-process: what the command prints, not what a process does.
    shown = CliRunner().invoke(rerun_command, [*base[1:], "--credentials", "presence", "--json"])
    assert shown.exit_code == 0, shown.output
    line = json.loads(shown.stdout.strip().splitlines()[-1])
    assert line["matched"] is True and line["credentials"] == "presence"
    plain = CliRunner().invoke(rerun_command, base[1:])
    assert plain.exit_code == 0 and "presence" not in plain.stdout, plain.output
    presence = CliRunner().invoke(rerun_command, [*base[1:], "--credentials", "presence"])
    assert "credentials compared by presence only" in presence.stdout, presence.output


@pytest.mark.slow
def test_the_pytest_plugin_passes_credentials_on(dataset: Path, tmp_path: Path, zygote: Zygote) -> None:
    with _server() as (base, _):
        record(dataset, "pay", lambda: _pay("httpx")(base))
    (tmp_path / "payagent.py").write_text(
        "import httpx\n"
        f"def pay():\n    httpx.post({base + '/pay?to=v-7'!r}, content=b'{{\"amount\": 5}}', headers="
        f"{{'X-Account': 'treasury', 'Content-Type': 'application/json', 'Authorization': 'Bearer {KEY_B}'}})\n",
        encoding="utf-8",
    )
    plugin = ["-p", "no:otel_replay", "-p", "otel_replay.rerun.pytest_plugin", "-p", "no:cacheprovider"]
    opts = ["--otel-replay-dataset", str(dataset), "--otel-replay-entrypoint", "payagent:pay"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}

    def run(*more: str) -> subprocess.CompletedProcess[str]:  # pytest in a process of its own
        return zygote.run(PYTEST, *plugin, *opts, *more, "--rootdir", str(tmp_path), str(tmp_path), cwd=str(tmp_path),
                          env=env)  # fmt: skip

    by_value = run()
    assert by_value.returncode == 1 and "only a credential header differs" in by_value.stdout, by_value.stdout
    by_presence = run("--otel-replay-credentials", "presence")
    assert by_presence.returncode == 0, by_presence.stdout + by_presence.stderr


# --- nothing stored lets a reader test a guess ------------------------------------------------------------


def test_stored_rows_hold_the_part_digests_but_neither_the_secret_nor_a_plain_hash_of_it(dataset: Path) -> None:
    _recorded(dataset)
    text = _stored_text(dataset)
    stored = b"".join(p.read_bytes() for p in dataset.rglob("*.parquet"))
    assert "digests" in text and "bearer" in text  # the parts are there, the scheme in clear
    assert KEY_A not in text and KEY_A.encode() not in stored
    plain = [hashlib.sha256(KEY_A.encode()).hexdigest(), hashlib.sha256(f"Bearer {KEY_A}".encode()).hexdigest()]
    plain += [hashlib.sha256(json.dumps([f"Bearer {KEY_A}"]).encode()).hexdigest()]
    framed = f"otel-replay http part v1\0{len('header authorization')}:header authorization\0"
    plain += [hashlib.sha256((framed + json.dumps([f"Bearer {KEY_A}"], separators=(",", ":"))).encode()).hexdigest()]
    for guess in plain:
        for size in (16, 32):
            assert guess[:size] not in text and guess[:size].encode() not in stored, guess


# --- a recording of format 2 keeps its own rules ----------------------------------------------------------


def test_a_format_2_recording_holds_no_part_digests_and_is_explained_as_before(
    dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from otel_replay.rerun import record as record_module
    from otel_replay.rerun.codec import arguments_codec
    from otel_replay.rerun.events import Fingerprint

    with _server() as (base, _), monkeypatch.context() as patch:  # the record mode of format 2, as it was
        patch.setattr(record_module, "RECORDING_FORMAT", 2)
        patch.setattr(record_module, "Fingerprint", functools.partial(Fingerprint, version=2))
        with arguments_codec(2):
            record(dataset, "pay", lambda: _pay("httpx")(base))
    assert "digests" not in _stored_text(dataset)
    # Codec 2 matched no headers: another key matches by value too; another body is pointed at, as it was.
    other_key = _rerun(dataset, base, _pay("httpx", auth=f"Bearer {KEY_B}"))
    assert other_key.matched, other_key.report()
    result = _rerun(dataset, base, _pay("httpx", amount=5000), credentials="presence")
    assert result.divergence is not None and "first difference at character" in result.divergence.expected
    assert "the parts that differ" not in result.divergence.expected
    assert "[✓ method ✓ host ✓ path ✓ query ✗ body]" in result.divergence.candidates[0], result.divergence.candidates


# --- hostile stored texts ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ['{"digests": 1}', '["digests":', '{"digests": {"headers": []}}', "[1, 2]", '"\\"digests\\":"', "", "\udcff"],
)
def test_stored_arguments_without_well_formed_digests_are_shown_as_they_are(text: str) -> None:
    from otel_replay.rerun.http_match import split_parts

    assert split_parts(text) == (text, None)


def test_only_credential_headers_sent_on_both_sides_with_one_scheme_count_as_credentials_only() -> None:
    from otel_replay.rerun.http_match import credentials_only, part_differences

    def parts(headers: dict[str, str], schemes: dict[str, str] | None = None, **rest: str) -> dict[str, Any]:
        return {"method": "m", "host": "h", "path": "p", "query": "q", "body": "b", **rest,
                "headers": headers, "schemes": schemes or {}}  # fmt: skip

    recorded = parts({"authorization": "1", "x-api-key": "2", "x-account": "3"}, {"authorization": "bearer"})
    keys = parts({"authorization": "4", "x-api-key": "5", "x-account": "3"}, {"authorization": "bearer"})
    assert credentials_only(recorded, keys) == ["authorization", "x-api-key"]
    assert part_differences(recorded, keys) == ["header authorization", "header x-api-key"]
    assert credentials_only(recorded, recorded) == []  # nothing differs: not a credential difference
    repeated = parts({**keys["headers"]}, {"authorization": "bearer,basic"})
    assert credentials_only(recorded, repeated) == []  # a repeat sent with another scheme
    assert credentials_only(recorded, parts({**keys["headers"], "x-account": "6"}, {"authorization": "bearer"})) == []
    assert credentials_only(recorded, {**keys, "path": "other"}) == []
    added = parts({**keys["headers"], "x-auth-token": "7"}, {"authorization": "bearer"})
    assert credentials_only(recorded, added) == []  # a credential the recorded call did not send
