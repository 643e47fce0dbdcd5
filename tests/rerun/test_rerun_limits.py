"""Limits: arguments that contain themselves, huge values, large arrays (rev-rr2 2); unwritable chunks (9)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from otel_replay.instrumentation import tool
from otel_replay.query.store import Store
from otel_replay.rerun import rerun
from otel_replay.rerun.codec import stable_json, unmatchable
from otel_replay.rerun.load import load_recording
from tests._support import Zygote

from .conftest import record


@dataclasses.dataclass(eq=False)
class Node:
    """A parse-tree node with a parent back-pointer: the argument contains itself."""

    name: str
    parent: Node | None = None
    children: list[Node] = dataclasses.field(default_factory=list)


def _tree(leaf: str) -> Node:
    root = Node("root")
    for name in ("a", leaf):
        root.children.append(Node(name, parent=root))
    return root


TREE: list[str] = ["b"]


@tool
def render(node: Node) -> int:
    """Takes a node of a tree whose children point back at it."""
    return len(node.children)


def _renders() -> int:
    return render(_tree(TREE[0]))


def _stored_arguments(dataset: Path, session_id: str) -> list[str]:
    with Store(dataset) as store:
        return [event.arguments for event in load_recording(store, session_id).events]


@pytest.mark.timeout(60)
def test_an_argument_that_contains_itself_is_recorded_at_once_and_compared_by_value(dataset: Path) -> None:
    output, _, events = record(dataset, "tree", _renders)  # hung the agent before (2^levels walks)
    assert output == 2 and events == 1
    (stored,) = _stored_arguments(dataset, "tree")
    assert '{"$cycle":' in stored and unmatchable(stored) is None
    assert rerun(_renders, dataset=dataset, session_id="tree", governance="strict").matched
    TREE[0] = "c"  # another tree: another argument
    try:
        changed = rerun(_renders, dataset=dataset, session_id="tree")
    finally:
        TREE[0] = "b"
    assert not changed.matched and changed.divergence is not None and "other arguments" in changed.divergence.reason


def test_a_back_reference_says_how_far_up_so_different_graphs_differ() -> None:
    loop: list[Any] = []
    loop.append(loop)
    inner: list[Any] = []
    outer = [inner]
    inner.append(outer)
    assert stable_json({"x": loop}) == '{"x":[{"$cycle":1}]}'
    assert stable_json([inner]) != stable_json([loop])
    shared = [1, 2]
    assert "$cycle" not in stable_json([shared, shared])  # seen twice, not inside itself: by value both times


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_value_past_the_node_budget_is_unmatchable_not_walked_whole() -> None:
    fan: list[Any] = [0]
    for _ in range(24):  # 2^24 paths through 24 lists: a DAG that walks like a 16 M node tree
        fan = [fan, fan]
    what = unmatchable(stable_json({"graph": fan}))
    assert what is not None and "more than 1000000 values" in what
    assert unmatchable(stable_json([1.5] * 2_000_000)) is None  # a float vector is not walked: no budget spent


def _image(np: Any, pixel: int) -> Any:
    image = np.zeros((200, 300, 3), dtype=np.uint8)
    image[10, 20, 1] = pixel
    return image


PIXEL: list[int] = [7]


@tool
def ocr(image: Any) -> str:
    """Reads text off an image (a NumPy array)."""
    return "INVOICE"


def test_a_large_array_is_hashed_by_dtype_shape_and_content_not_listed(dataset: Path) -> None:
    np = pytest.importorskip("numpy")

    def reads() -> str:
        return ocr(_image(np, PIXEL[0]))

    record(dataset, "ocr", reads)
    (stored,) = _stored_arguments(dataset, "ocr")
    assert len(stored) < 400 and '"$numpy"' in stored and '"|u1",[200,300,3]' in stored  # was 700 KB of digits
    assert rerun(reads, dataset=dataset, session_id="ocr", governance="strict").matched
    PIXEL[0] = 8  # one value in 180,000 differs
    try:
        assert not rerun(reads, dataset=dataset, session_id="ocr").matched
    finally:
        PIXEL[0] = 7
    small = np.arange(6, dtype=np.int64).reshape(2, 3)  # small arrays are still listed, as codec 2 always did
    assert stable_json(small) == '{"$numpy":["numpy:ndarray","int64",[[0,1,2],[3,4,5]]]}'
    assert stable_json(np.ascontiguousarray(_image(np, 1).transpose(1, 0, 2))) == stable_json(
        _image(np, 1).transpose(1, 0, 2)
    )  # the digest is of the values in C order, whatever the memory layout


# --- rev-rr2 finding 9: a tracer that cannot hold the chunks ---------------------------------------


def test_recording_through_a_tracer_that_would_cut_its_chunks_is_refused_up_front(
    dataset: Path, zygote: Zygote
) -> None:
    script = """
import os, time
os.environ["OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT"] = "4096"
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
trace.set_tracer_provider(TracerProvider())
from otel_replay.errors import ConfigError
from otel_replay.rerun import recording
try:
    with recording("cut"):
        time.time()
except ConfigError as exc:
    print("refused:", exc)
"""
    done = zygote.run(script)  # a process of its own: its tracer provider is not this one's
    assert done.returncode == 0, done.stderr
    assert "refused: otel-replay cannot record through this tracer" in done.stdout, done.stderr
    assert "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT" in done.stdout


@pytest.mark.slow
def test_chunks_that_cannot_be_written_are_retried_with_backoff_not_per_event(zygote: Zygote) -> None:
    script = """
import logging, os, time
logging.basicConfig(level=logging.ERROR)
from otel_replay.rerun import recording
with recording("late") as mode:
    # A provider set up after the recording started, with a length limit: every chunk write now fails.
    os.environ["OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT"] = "4096"
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    trace.set_tracer_provider(TracerProvider())
    for _ in range(8000):
        time.time()
    print("pending", len(mode._pending))
"""
    done = zygote.run(script, timeout=300)  # a process of its own: its tracer provider is not this one's
    assert done.returncode == 0, done.stderr
    assert "pending 8000" in done.stdout, done.stderr  # nothing lost: still pending, in order
    assert done.stderr.count("Traceback") <= 2  # one for the first failed write (and the final chunk's), not 7,700
    assert 3 <= done.stderr.count("a chunk still cannot be written") <= 6  # at 512, 1024, 2048, 4096 events pending


# --- an output past the budget (or with no value representation) is not compared as equal ---------

ROWS: list[int] = [0]


@tool
def rows() -> int:
    """How many rows to return."""
    return 1_100_000


def _big_output() -> list[list[int]]:
    return [[ROWS[0]] for _ in range(rows())]  # 1.1 M values: past the encoder's budget


@pytest.mark.slow
def test_an_output_that_cannot_be_compared_is_a_divergence_not_a_match(dataset: Path) -> None:
    import otel_replay
    from otel_replay.rerun import recording

    telemetry = otel_replay.configure(dataset, service_name="rerun-tests", set_global=False)
    try:
        with recording("big") as mode:
            assert mode is not None
            mode.set_output(_big_output())
        telemetry.force_flush()
    finally:
        telemetry.shutdown()
    ROWS[0] = 1  # another output: it hashed the same as the recorded one, and matched
    try:
        result = rerun(_big_output, dataset=dataset, session_id="big")
    finally:
        ROWS[0] = 0
    assert not result.matched and result.divergence is not None
    assert "no value representation" in result.divergence.reason and "1000000 values" in result.divergence.reason
