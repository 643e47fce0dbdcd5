"""The act boundary: ``ActionGate.commit``, so a rerun never commits the original run's actions again.

Recording keeps the receipt the rail returned; a rerun hands that receipt back
without calling the rail (and without a new commit record: the original
one, sealed in the dataset, is what compensation later acts on). Matched on the
action's type, arguments and cost; the decision's record id is not matched
(it is new in every run).
"""

from __future__ import annotations

from typing import Any

from otel_replay._seam import through
from otel_replay.errors import ReplayMismatchError
from otel_replay.gate import ActionGate
from otel_replay.rerun.callers import INSIDE
from otel_replay.rerun.codec import decode_result, encode_result, stable_json
from otel_replay.rerun.events import BoundaryCall, stream_key
from otel_replay.rerun.patching import PatchSet

__all__ = ["install_actions"]


class _Live:
    """The rail's own receipt, as it came back from a live commit (stored as :func:`encode_result` of it)."""

    __slots__ = ("receipt",)

    def __init__(self, receipt: Any) -> None:
        self.receipt = receipt


def _stored(live: _Live) -> Any:
    return encode_result(live.receipt)


def _decode(value: Any) -> Any:
    if isinstance(value, _Live):  # committed for real (recording, or a relaxed rerun's miss): hand it on as is
        return value.receipt
    if isinstance(value, dict) and "$unrecordable" in value:
        raise ReplayMismatchError(f"the recorded commit returned a receipt that could not be recorded: {value}")
    return decode_result(value)


def _commit(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if INSIDE.get() or not args:
        return wrapped(*args, **kwargs)
    action = args[0]
    name = str(getattr(action, "type", "?"))
    arguments = stable_json(
        {"type": name, "arguments": getattr(action, "arguments", None), "cost": getattr(action, "cost", None)}
    )
    call = BoundaryCall("act", name, stream=stream_key("act", name), arguments_text=arguments, record_as=_stored)
    return _decode(through(call, lambda: _Live(wrapped(*args, **kwargs))))


def install_actions(patches: PatchSet) -> None:
    """Wrap ``ActionGate.commit`` into ``patches``."""
    patches.wrap(ActionGate, "commit", _commit)
