"""What ``rerun`` and ``report rerun`` say when the session asked for has no recording: what the dataset does hold."""

from __future__ import annotations

import difflib

import click

from otel_replay.cli.render import clean, one_line
from otel_replay.errors import RecordNotFound
from otel_replay.query.store import Store
from otel_replay.rerun.load import recorded_sessions

__all__ = ["no_recording"]

_NO_RECORDING = "no recording for session"


def no_recording(store: Store, session_id: str, exc: RecordNotFound) -> click.ClickException | None:
    """``exc`` as one line naming the closest recorded session ids; ``None`` when it is not about the session."""
    if not str(exc).startswith(_NO_RECORDING):
        return None
    names = [str(row["session_id"]) for row in recorded_sessions(store)]
    if not names:
        return click.ClickException(
            f"{one_line(exc)} (the dataset holds no recorded session: record one with otel_replay.recording())"
        )
    close = difflib.get_close_matches(session_id, names, n=3, cutoff=0.6)
    said = ", ".join(repr(clean(name)) for name in (close or names[-5:]))
    hint = f"did you mean {said}?" if close else f"its {len(names)} recorded session(s) include {said}"
    return click.ClickException(f"{one_line(exc)}; {hint}")
