"""pytest plugin: every recorded session becomes a test case (Continuous Replay, CI for agent behaviour).

``pytest --otel-replay-dataset DIR --otel-replay-entrypoint module:function``
adds one test per recorded session of DIR; each reruns the entrypoint from
the recording and fails with the readable divergence (first divergent step,
what was recorded, what the rerun did, the closest recorded calls). Without
``--otel-replay-dataset`` the plugin adds nothing. Registered under the
``pytest11`` entry point, so installing otel-replay is enough.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pytest

__all__ = ["RerunDiverged", "recorded_session_item"]


class RerunDiverged(Exception):
    """A recorded session's rerun did not match; the message is the readable report."""


def pytest_addoption(parser: pytest.Parser) -> None:
    """Declare the ``--otel-replay-*`` options."""
    group = parser.getgroup("otel-replay", "rerun recorded agent sessions as tests")
    group.addoption("--otel-replay-dataset", metavar="DIR", help="Dataset whose recorded sessions become tests.")
    group.addoption(
        "--otel-replay-entrypoint",
        metavar="MODULE:FUNCTION",
        help="The agent to rerun (no arguments), imported with the current directory first on the path.",
    )
    group.addoption(
        "--otel-replay-governance", choices=("relaxed", "strict"), default="relaxed", help="Rerun governance level."
    )
    group.addoption("--otel-replay-match", metavar="GLOB", help="Only sessions whose id matches this glob.")
    group.addoption(
        "--otel-replay-allow-live",
        metavar="HOST:PORT",
        action="append",
        default=[],
        help="Let calls to HOST:PORT (or HOST:*) run live instead of being refused as leaks (repeatable).",
    )
    group.addoption(
        "--otel-replay-credentials",
        choices=("value", "presence"),
        default="value",
        help="Compare HTTP credential headers by value (default) or by presence and scheme only.",
    )


@functools.cache
def recorded_session_item() -> type[pytest.Item]:
    """The test item class (built on first use, so importing this module never needs pytest)."""
    # pytest is there whenever it loads this plugin; the module imports without it (the wheel has no pytest)
    import pytest

    class RecordedSession(pytest.Item):
        """One recorded session, rerun as a test."""

        def __init__(
            self,
            *,
            session_id: str,
            dataset: str,
            entrypoint: str,
            governance: str,
            allow_live: tuple[str, ...] = (),
            credentials: str = "value",
            **kwargs: Any,
        ) -> None:
            super().__init__(**kwargs)
            self.session_id = session_id
            self.dataset = dataset
            self.entrypoint = entrypoint
            self.governance = governance
            self.allow_live = allow_live
            self.credentials = credentials

        def runtest(self) -> None:
            """Rerun the session; fail with the divergence report when it does not match."""
            # start-up cost: loaded in every pytest run of a project with otel-replay; a rerun loads when asked
            from otel_replay.rerun.runner import rerun

            result = rerun(
                self.entrypoint,
                dataset=self.dataset,
                session_id=self.session_id,
                governance=self.governance,  # type: ignore[arg-type]
                write=False,
                allow_live=self.allow_live,
                credentials=self.credentials,  # type: ignore[arg-type]
            )
            if not result.matched:
                raise RerunDiverged(result.report())

        def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
            """The divergence report itself, not a traceback."""
            if isinstance(excinfo.value, RerunDiverged):
                return str(excinfo.value)
            return f"{type(excinfo.value).__name__}: {excinfo.value}"

        def reportinfo(self) -> tuple[Path, int | None, str]:
            """Where the test comes from: the dataset and the session id."""
            return Path(self.dataset), None, f"recorded session {self.session_id}"

    return RecordedSession


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Append one test item per recorded session of the dataset."""
    # pytest is there whenever it loads this plugin; the module imports without it (the wheel has no pytest)
    import pytest

    dataset = config.getoption("otel_replay_dataset", default=None)
    if not dataset:
        return
    entrypoint = config.getoption("otel_replay_entrypoint")
    if not entrypoint:
        raise pytest.UsageError("--otel-replay-dataset needs --otel-replay-entrypoint module:function")
    if not Path(dataset).is_dir():
        raise pytest.UsageError(f"--otel-replay-dataset {dataset} does not exist or is not a directory")
    # start-up cost: the plugin loads in every pytest run of a project with otel-replay; a rerun loads when asked
    import fnmatch

    from otel_replay.errors import ConfigError
    from otel_replay.query.store import Store
    from otel_replay.rerun.guards import parse_allow_live
    from otel_replay.rerun.load import recorded_sessions

    with Store(dataset) as store:
        sessions = [str(row["session_id"]) for row in recorded_sessions(store)]
    pattern = config.getoption("otel_replay_match")
    if pattern:
        sessions = [s for s in sessions if fnmatch.fnmatchcase(s, pattern)]
    governance = config.getoption("otel_replay_governance")
    allow_live = tuple(config.getoption("otel_replay_allow_live") or ())
    try:
        parse_allow_live(allow_live)
    except ConfigError as exc:
        raise pytest.UsageError(f"--otel-replay-allow-live: {exc}") from None
    for sid in sessions:
        items.append(
            recorded_session_item().from_parent(
                session,
                name=f"rerun[{sid}]",
                session_id=sid,
                dataset=str(dataset),
                entrypoint=entrypoint,
                governance=governance,
                allow_live=allow_live,
                credentials=config.getoption("otel_replay_credentials"),
            )
        )
