"""Policy replay: does a recorded decision still hold under the state that is live now.

:func:`replay` is pure. It deep-copies the live state, the snapshot state and
the action before the policy sees them, mutates nothing and executes nothing;
side effects belong to :class:`otel_replay.ActionGate`.

==============  ==========================================================
verdict         when
==============  ==========================================================
ALLOW           the policy justifies the action under the live state
ROLLBACK        justified on the recorded snapshot, not on the live state
BLOCK           justified under neither
HUMAN_REVIEW    the policy raised :class:`ReplayUndecidable`
==============  ==========================================================
"""

from __future__ import annotations

import copy
import enum
import importlib
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from otel_replay._display import html_of
from otel_replay.errors import PayloadError, PolicyError, PolicyLoadError, ReplayUndecidable
from otel_replay.gate.receipts import _text as _sealable  # a reason is sealed into gate records: UTF-8 text
from otel_replay.records import Action, DecisionRecord

__all__ = ["FixAction", "Policy", "Verdict", "load_callable", "load_policy", "replay"]

Policy = Callable[[Mapping[str, Any], Action], "tuple[bool, str]"]
"""``(state, action) -> (justified, reason)``."""


class FixAction(enum.StrEnum):
    """The fix a verdict routes."""

    ALLOW = "ALLOW"
    ROLLBACK = "ROLLBACK"
    BLOCK = "BLOCK"
    HUMAN_REVIEW = "HUMAN_REVIEW"


@dataclass(frozen=True)
class Verdict:
    """The outcome of :func:`replay`.

    ``trace_id``/``span_id`` point at the decision span, so the gate can link
    its own span to it.
    """

    fix: FixAction
    justified: bool
    reason: str
    record_id: str
    trace_id: str = ""
    span_id: str = ""
    correlation_id: str | None = None

    def _repr_html_(self) -> str:
        """The verdict as a report page in a sandboxed frame (a notebook shows it; see :mod:`otel_replay.report`)."""
        return html_of(self)


def _is_bool(value: Any) -> bool:
    """True for ``True``/``False`` and numpy's bool (a policy computing over arrays returns one).

    numpy names its bool type ``numpy.bool_`` before 2.0 and ``numpy.bool`` since.
    """
    kind = type(value)
    return isinstance(value, bool) or (kind.__name__ in ("bool", "bool_") and kind.__module__ == "numpy")


def _ask(policy: Policy, state: Mapping[str, Any], action: Action, what: str = "live state") -> tuple[bool, str]:
    """The policy's ``(justified, reason)`` for ``action`` under ``state`` (``what`` names the state in errors).

    Fails closed: anything but a real bool and a str (a swapped tuple, a bare
    string, ``1``, ``None``) is a :class:`PolicyError` naming the policy and what
    it returned, never coerced into a verdict; so is a policy that raises
    ``SystemExit`` or another ``BaseException`` (an exit is not an answer, and
    a CLI exiting 0 there would read as success). ``KeyboardInterrupt`` is
    the user's and goes through.
    """
    name = getattr(policy, "__qualname__", repr(policy))
    try:
        state_copy, action_copy = copy.deepcopy(dict(state)), copy.deepcopy(action)
    except RecursionError:
        raise PayloadError(f"the {what} is nested too deeply to replay (Python's recursion limit)") from None
    try:
        result = policy(state_copy, action_copy)
    except (ReplayUndecidable, KeyboardInterrupt):
        raise
    except BaseException as exc:
        raise PolicyError(f"policy {name} raised {type(exc).__name__}: {_said(exc)}") from exc
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise PolicyError(f"policy {name} must return (justified, reason), got {_shown(result)}")
    justified, reason = result
    if not _is_bool(justified) or not isinstance(reason, str):
        raise PolicyError(
            f"policy {name} must return (justified, reason) with justified a bool and reason a str, got "
            f"{_shown(result)} ({type(justified).__name__}, {type(reason).__name__})"
        )
    return bool(justified), _sealable(str.__str__(reason))


def _said(exc: BaseException) -> str:
    """``str(exc)`` for an error line (never raises: an exception's ``__str__`` is the policy's code too)."""
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__
        return f"<{type(exc).__name__}>"


def _shown(value: Any) -> str:
    """``repr(value)`` for an error line, cut to 200 characters (never raises)."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a broken __repr__
        return f"<{type(value).__name__}>"
    return text if len(text) <= 200 else text[:200] + "..."


def replay(record: DecisionRecord, *, live_state: Mapping[str, Any], policy: Policy) -> Verdict:
    """Re-derive whether ``record``'s action still holds under ``live_state``.

    Raises:
        ValueError: the record has no snapshot or no action (nothing to replay).
        PolicyError: the policy raised, or returned anything but ``(bool, str)``.
        PayloadError: a state is nested too deeply to copy for the policy.

    """
    if record.snapshot is None or record.action is None:
        raise ValueError(
            f"record {record.record_id} has no {'snapshot' if record.snapshot is None else 'action'}; "
            "only audit() decisions with an act() can be replayed"
        )

    def verdict(fix: FixAction, justified: bool, reason: str) -> Verdict:
        return Verdict(
            fix, justified, reason, record.record_id, record.span.trace_id, record.span.span_id, record.correlation_id
        )

    try:
        live_ok, live_reason = _ask(policy, live_state, record.action)
        if live_ok:
            return verdict(FixAction.ALLOW, True, live_reason)
        snap_ok, snap_reason = _ask(policy, record.snapshot.state, record.action, "recorded snapshot state")
    except ReplayUndecidable as exc:
        return verdict(FixAction.HUMAN_REVIEW, False, _sealable(_said(exc)) or "policy could not decide")
    if snap_ok:
        return verdict(FixAction.ROLLBACK, False, f"stale state: justified on the snapshot, not now: {live_reason}")
    return verdict(FixAction.BLOCK, False, f"not justified even on its own snapshot: {snap_reason}")


IMPORT_HELP = "imported with the current directory first on the path, as `python -m` does"
"""How :func:`load_callable` finds a module (said in the help of every option taking a reference)."""


def _current_directory_on_path() -> None:
    """Put the current directory first on ``sys.path`` when it is not on it (as ``python -m`` does).

    So ``--entrypoint``, ``--policy`` and ``--rail`` find a module of the project they are run from,
    whichever way the program was started (the console script puts only its own directory there).
    """
    try:
        here = os.getcwd()
    except OSError:  # the directory was removed under us: nothing to add
        return
    if "" not in sys.path and here not in sys.path:
        sys.path.insert(0, here)


def load_callable(reference: str, what: str = "policy") -> Any:
    """Import a callable from ``"package.module:function"``; ``what`` names it in errors.

    The module is imported with the current directory first on ``sys.path`` (added there when
    missing, as ``python -m`` does), so a module of the project in that directory is found.
    """
    if not isinstance(reference, str):
        raise PolicyLoadError(f"{what} must be a 'package.module:function' string, got {type(reference).__name__}")
    module_name, sep, attr = reference.partition(":")
    if not sep or not module_name or not attr:
        raise PolicyLoadError(f"{what} {reference!r} must look like 'package.module:function'")
    _current_directory_on_path()
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise PolicyLoadError(f"{what} {reference!r}: cannot import module {module_name!r}: {exc}") from exc
    except (TypeError, ValueError) as exc:
        if not module_name.startswith("."):
            raise  # the module's own code raised it while it was imported: not a matter of its name
        # a relative name (".mod", ".."): no package to resolve it
        raise PolicyLoadError(
            f"{what} {reference!r}: cannot import module {module_name!r}: give its absolute name ({exc})"
        ) from None
    target: Any = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise PolicyLoadError(f"{what} {reference!r}: module {module_name!r} has no {attr!r}") from None
    if not callable(target):
        raise PolicyLoadError(f"{what} {reference!r} is not callable")
    return target


def load_policy(reference: str) -> Policy:
    """Import a policy from ``"package.module:function"``."""
    return load_callable(reference, "policy")
