"""The state stores: atomic updates across threads and processes, resume after restart, refusal of bad files."""

from __future__ import annotations

import json
import multiprocessing
import sqlite3
import threading
import warnings
from pathlib import Path

import pytest

from otel_replay.contracts.engine import Engine
from otel_replay.contracts.state import SessionState, SessionStateError, output_digest
from otel_replay.contracts.store import (
    STORE_FORMAT,
    FileStateStore,
    MemoryStateStore,
    StateStore,
    governance_store_path,
)

from ._engine_support import call, refund_bot, run_step
from ._store_race import hold_the_lock, one_refund_contracts, race

ROUNDS = 40


@pytest.fixture(params=["memory", "file", "file-no-fsync"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> StateStore:
    if request.param == "memory":
        return MemoryStateStore()
    return FileStateStore(tmp_path / "s.sqlite3", fsync=request.param == "file")


def test_a_file_store_is_in_write_ahead_log_mode_and_syncs_as_asked(tmp_path: Path) -> None:
    durable = FileStateStore(tmp_path / "a.sqlite3")
    lax = FileStateStore(tmp_path / "b.sqlite3", fsync=False)
    with sqlite3.connect(tmp_path / "a.sqlite3") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert durable._connection().execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert lax._connection().execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL


def _bump(state: SessionState | None) -> SessionState:
    current = state if state is not None else SessionState(session_id="s")
    current.total_step_count += 1
    return current


def test_update_creates_then_changes_and_load_returns_a_copy(store: StateStore) -> None:
    assert store.load("s") is None
    first = store.update("s", _bump)
    assert (first.total_step_count, first.state_version) == (1, 0)
    second = store.update("s", _bump)
    assert (second.total_step_count, second.state_version) == (2, 1)  # the store raised the version
    loaded = store.load("s")
    assert loaded == second and loaded is not second
    loaded.total_step_count = 99  # type: ignore[union-attr]
    assert store.load("s").total_step_count == 2  # type: ignore[union-attr]


def test_a_change_that_raises_saves_nothing(store: StateStore) -> None:
    store.update("s", _bump)

    def broken(state: SessionState | None) -> SessionState:
        assert state is not None
        state.total_step_count = 1000
        raise RuntimeError("agent crashed mid-change")

    with pytest.raises(RuntimeError, match="mid-change"):
        store.update("s", broken)
    assert store.load("s").total_step_count == 1  # type: ignore[union-attr]
    assert store.update("s", _bump).total_step_count == 2


def test_a_change_must_return_the_same_sessions_state(store: StateStore) -> None:
    with pytest.raises(ValueError, match="a change of session 's' returned the state of 'other'"):
        store.update("s", lambda _state: SessionState(session_id="other"))
    with pytest.raises(TypeError, match="must return a SessionState"):
        store.update("s", lambda _state: None)  # type: ignore[arg-type, return-value]
    assert store.load("s") is None


def test_threads_never_lose_an_update(store: StateStore) -> None:
    def work() -> None:
        for _ in range(50):
            store.update("s", _bump)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    final = store.load("s")
    assert final is not None and final.total_step_count == 300
    assert final.state_version == 299


def test_a_restarted_process_resumes_phase_counts_and_forbidden_tools(tmp_path: Path) -> None:
    path = tmp_path / "governance" / "sessions.sqlite3"
    engine = Engine(refund_bot())
    store = FileStateStore(path)

    def step(calls_: list, output: dict | None = None):  # type: ignore[no-untyped-def,type-arg]
        def change(state: SessionState | None) -> SessionState:
            current = state if state is not None else engine.new_state("conv-1", None)
            run_step(engine, current, calls_)
            if output is not None:
                engine.observe_output(current, calls_[0].name, output)
            return current

        return change

    store.update("conv-1", step([call("lookup_customer", {"customer_email": "a@b.test"})]))
    store.update("conv-1", step([call("check_eligibility", {"order_id": "ORD-9"})], {"eligible": True}))
    store.update("conv-1", step([call("issue_refund", {"amount": 3, "customer_id": "C1"})]))
    store.close()
    resumed = FileStateStore(path).load("conv-1")
    assert resumed is not None
    assert resumed.current_phase == "refund_issued"
    assert resumed.forbidden_tools == ["issue_refund"]
    assert resumed.tool_call_counts == {"lookup_customer": 1, "check_eligibility": 1, "issue_refund": 1}
    assert resumed.satisfied_preconditions == {"check_eligibility": {"$.eligible": output_digest(True)}}
    again = engine.evaluate(resumed, [call("issue_refund", {"amount": 3, "customer_id": "C1"})])
    assert "forbidden" in [f.rule for f in again.failures]


def test_two_processes_never_both_take_the_last_allowed_refund(tmp_path: Path) -> None:
    path = str(tmp_path / "race.sqlite3")
    FileStateStore(path).close()  # closed before the fork: no SQLite connection is carried into the children
    # Forked, not spawned: each racer is a process of its own with the package already imported (a spawned one
    # spent most of its CPU importing it); each opens its own connection to the file.
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(2)
    results = context.Queue()
    workers = [context.Process(target=race, args=(path, ROUNDS, barrier, results, n)) for n in range(2)]
    for worker in workers:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # "multi-threaded, fork() may deadlock": see above
            worker.start()
    won = dict(results.get(timeout=600) for _ in workers)
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    assert sorted(won[0] + won[1]) == list(range(ROUNDS))  # each round won exactly once, never twice
    store = FileStateStore(path)
    engine = Engine(one_refund_contracts())
    for number in range(ROUNDS):
        state = store.load(f"round-{number}")
        assert state is not None
        assert state.tool_call_counts == {"refund": 1}
        assert (state.total_step_count, state.total_block_count) == (2, 1)
        assert engine.narrow(state, ["refund"]).kept == ()


def test_a_process_killed_holding_the_lock_loses_its_change_and_blocks_nobody(tmp_path: Path) -> None:
    path = str(tmp_path / "sessions.sqlite3")
    store = FileStateStore(path)
    store.update("conv-1", lambda _state: SessionState(session_id="conv-1", total_tool_calls=1))
    context = multiprocessing.get_context("spawn")
    holding = context.Event()
    child = context.Process(target=hold_the_lock, args=(path, "conv-1", holding))
    child.start()
    try:
        assert holding.wait(timeout=600), "the child never took the lock"
    finally:
        child.kill()
        child.join(timeout=60)
    after = store.update("conv-1", _bump)  # the dead process's lock is gone, its change never landed
    assert (after.total_tool_calls, after.total_step_count, after.state_version) == (1, 1, 1)
    assert store.load("conv-1") == after


def test_a_file_that_is_not_a_database_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "sessions.sqlite3"
    path.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(SessionStateError, match=f"session store {path}: not a readable SQLite session store"):
        FileStateStore(path)
    assert path.read_bytes().startswith(b"this is not sqlite")  # untouched


def test_another_database_is_not_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "other.sqlite3"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE invoices (id INTEGER)")
    with pytest.raises(SessionStateError, match="not a session store \\(it holds tables invoices\\)"):
        FileStateStore(path)


def test_a_store_from_a_newer_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "sessions.sqlite3"
    FileStateStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {STORE_FORMAT + 1}")
    with pytest.raises(SessionStateError, match="layout version 2 was written by a newer otel-replay"):
        FileStateStore(path)


def _poke(path: Path, session_id: str, state: str, version: int = 0) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute(
            "UPDATE sessions SET state = ?, state_version = ? WHERE session_id = ?", (state, version, session_id)
        )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{broken", "corrupt state: not JSON"),
        (json.dumps({"format": 99, "session_id": "conv-7"}), "state format 99 was written by a newer otel-replay"),
        (json.dumps({"format": 1, "session_id": "conv-7", "total_tool_calls": "many"}), "'total_tool_calls'"),
        (SessionState(session_id="someone-else").to_json(), "its id or version disagrees"),
    ],
)
def test_a_corrupt_or_newer_state_is_an_error_naming_file_and_session_never_a_reset(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "sessions.sqlite3"
    store = FileStateStore(path)
    store.update("conv-7", lambda _state: SessionState(session_id="conv-7", total_tool_calls=5))
    _poke(path, "conv-7", text)
    where = f"session store {path} session 'conv-7'"
    with pytest.raises(SessionStateError, match="^" + where.replace("(", "\\(")) as caught:
        store.load("conv-7")
    assert message in str(caught.value)
    with pytest.raises(SessionStateError, match=message.replace("(", "\\(").replace("'", "'")):
        store.update("conv-7", _bump)
    with sqlite3.connect(path) as conn:  # the row was left as it was: nothing reset it
        assert conn.execute("SELECT state FROM sessions").fetchone()[0] == text


def test_the_store_of_a_dataset_sits_in_the_dataset_and_an_s3_one_stays_local(tmp_path: Path) -> None:
    assert governance_store_path(tmp_path) == tmp_path / "_governance" / "sessions.sqlite3"
    remote = governance_store_path("s3://bucket/prefix")
    assert not str(remote).startswith("s3:")
    assert remote.parts[-4:-2] == ("otel-replay", "governance")
    assert remote.name == "sessions.sqlite3"
    assert governance_store_path("s3://bucket/other") != remote
    store = FileStateStore.for_dataset(tmp_path)
    store.update("s", _bump)
    assert store.session_ids() == ["s"]


@pytest.mark.parametrize(
    "session_id",
    ["", "a\x00b", "x" * 10_000, "conv-\u00e9\U0001f600", "'; DROP TABLE sessions; --", "\ud800"],
)
def test_any_session_id_is_a_key_and_nothing_else(store: StateStore, session_id: str) -> None:
    if "\ud800" in session_id and isinstance(store, FileStateStore):
        with pytest.raises(SessionStateError, match="session '\\\\ud800': the id is not valid Unicode text"):
            store.update(session_id, lambda _state: SessionState(session_id=session_id))
        with pytest.raises(SessionStateError, match="not valid Unicode"):
            store.load(session_id)
        return
    store.update(session_id, lambda _state: SessionState(session_id=session_id, total_tool_calls=3))
    store.update("other", lambda _state: SessionState(session_id="other"))
    loaded = store.load(session_id)
    assert loaded is not None and loaded.session_id == session_id and loaded.total_tool_calls == 3
    assert store.load("other") is not None


def test_a_store_that_cannot_be_created_names_its_path(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(
        SessionStateError, match=f"session store {blocker}/sessions.sqlite3: cannot create its directory"
    ):
        FileStateStore(blocker / "sessions.sqlite3")


def test_a_version_past_what_sqlite_holds_is_an_error_naming_the_session_never_a_wrap(tmp_path: Path) -> None:
    """A state whose version cannot be stored (2**63) or a row whose version is a float is refused, clearly."""
    path = tmp_path / "sessions.sqlite3"
    store = FileStateStore(path)
    store.update("conv-7", lambda _state: SessionState(session_id="conv-7"))
    state = SessionState(session_id="conv-7", state_version=2**63)
    with sqlite3.connect(path) as conn:  # SQLite keeps a number that large as a float, equal to 2**63
        conn.execute("UPDATE sessions SET state = ?, state_version = 9.223372036854775807e18", (state.to_json(),))
    with pytest.raises(SessionStateError, match="session 'conv-7': corrupt state: its row's version is not an int"):
        store.load("conv-7")
    with pytest.raises(SessionStateError, match="session 'conv-7'"):
        store.update("conv-7", lambda current: current or SessionState(session_id="conv-7"))
    for name in ("state_version", "total_tool_calls"):
        with pytest.raises(SessionStateError, match=f"'{name}' must be a non-negative integer"):
            SessionState.from_json(SessionState(session_id="s", **{name: 2**63}).to_json())  # type: ignore[arg-type]


def test_a_tool_output_checked_by_with_output_never_reaches_the_store_file(tmp_path: Path) -> None:
    """The state keeps a digest of the value at a with_output path; the condition still holds on it."""
    path = tmp_path / "sessions.sqlite3"
    engine = Engine(refund_bot())
    store = FileStateStore(path, fsync=False)
    secret_output = {"eligible": True, "note": "jane.doe@example.test holds card 4111 1111 1111 1111"}

    def lookup_then_check(state: SessionState | None) -> SessionState:
        current = state if state is not None else engine.new_state("conv-9", None)
        run_step(engine, current, [call("lookup_customer", {"customer_email": "a@b.test"})])
        run_step(engine, current, [call("check_eligibility", {"order_id": "ORD-9"})])
        engine.observe_output(current, "check_eligibility", secret_output)
        return current

    store.update("conv-9", lookup_then_check)
    store.close()
    raw = path.read_bytes() + b"".join(p.read_bytes() for p in tmp_path.glob("sessions.sqlite3*"))
    assert b'eligible":true' not in raw.replace(b" ", b"") and b"jane.doe" not in raw
    resumed = FileStateStore(path).load("conv-9")
    assert resumed is not None
    refund = [call("issue_refund", {"amount": 3, "customer_id": "C1"})]
    assert engine.evaluate(resumed, refund).outcome == "allow"  # the digest says eligible is true
    engine.observe_output(resumed, "check_eligibility", {"eligible": 1})  # 1 is not true in JSON
    assert [f.rule for f in engine.evaluate(resumed, refund).failures] == ["precondition"]


def test_a_state_saved_with_output_values_by_format_1_is_read_with_their_digests() -> None:
    engine = Engine(refund_bot())
    state = engine.new_state("old", None)
    run_step(engine, state, [call("lookup_customer", {"customer_email": "a@b.test"})])
    run_step(engine, state, [call("check_eligibility", {"order_id": "ORD-9"})])
    body = json.loads(state.to_json())
    body["format"] = 1
    body["satisfied_preconditions"] = {"check_eligibility": {"$.eligible": True, "$.odd": 1.0}}
    again = SessionState.from_json(json.dumps(body))
    assert again.satisfied_preconditions == {
        "check_eligibility": {"$.eligible": output_digest(True), "$.odd": output_digest(1)}
    }
    refund = [call("issue_refund", {"amount": 3, "customer_id": "C1"})]
    assert engine.evaluate(again, refund).outcome == "allow"


@pytest.mark.parametrize("value", ["true", "sha256:short", 7, {"nested": "sha256:" + "0" * 64}])
def test_a_format_2_state_holding_anything_but_digests_for_outputs_is_refused(value: object) -> None:
    body = json.loads(SessionState(session_id="s").to_json())
    body["satisfied_preconditions"] = {"check_eligibility": {"$.eligible": value}}
    with pytest.raises(SessionStateError, match="'satisfied_preconditions'"):
        SessionState.from_json(json.dumps(body))
