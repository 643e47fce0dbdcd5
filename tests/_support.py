"""Helpers shared by the tests (policies, snapshots, actions)."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from otel_replay import Action, DependencySnapshot

TEST_KEY = "test-signing-key-0123456789abcdef"
"""The one signing key of the tests (set for every test by ``tests/conftest.py``)."""


@dataclass(frozen=True)
class Demo:
    """The dataset ``otel-replay demo`` writes, and the ids of its one decision (and of the decision's span)."""

    path: Path
    record_id: str
    correlation_id: str
    trace_id: str
    span_id: str


def budget_policy(state, action):
    if action.arguments.get("recipient") not in state.get("allow_list", []):
        return False, "recipient not allow-listed"
    if action.cost > state.get("budget_remaining", 0):
        return False, "over budget"
    return True, "within budget"


SNAPSHOT_STATE = {"budget_remaining": 10_000, "allow_list": ["acme-supplies"]}


def payment(cost: float = 4200, recipient: str = "acme-supplies") -> Action:
    return Action("vendor_payment", {"recipient": recipient}, cost=cost)


def snapshot() -> DependencySnapshot:
    return DependencySnapshot(SNAPSHOT_STATE, version="v7", captured_at="2026-01-01T00:00:00+00:00")


def in_forked_child(work: Callable[[], Any]) -> Any:
    """What ``work()`` returns when run in a forked child of this process (JSON through a pipe)."""
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # "multi-threaded, fork() may deadlock": none is held
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.write(write, json.dumps(work()).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as pipe:
        return json.loads(pipe.read())


def timestamps_as_ints(t: pa.DataType) -> pa.DataType:
    """``t`` with every timestamp (also inside lists and structs) as int64: a table cast to it keeps raw ns values."""
    if pa.types.is_timestamp(t):
        return pa.int64()
    if pa.types.is_list(t):
        return pa.list_(timestamps_as_ints(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(timestamps_as_ints(f.type)) for f in t])
    return t
