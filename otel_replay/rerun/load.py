"""Rehydrate a session's recording from the dataset: verified chunks only, in order, events intact."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from otel_replay import semconv as sc
from otel_replay._json import strict_loads
from otel_replay.errors import ConfigError, DatasetError, PayloadError, RecordNotFound, UntrustedRecord
from otel_replay.integrity import MISPLACED, stored_record
from otel_replay.query.store import Store
from otel_replay.rerun.codec import RECORDING_FORMAT, arguments_codec, codec_of_format, match_key
from otel_replay.rerun.events import FINGERPRINT_VERSION, Event, Fingerprint, value_hash

_log = logging.getLogger(__name__)

__all__ = ["Recording", "fingerprint_version", "load_recording", "recorded_sessions"]


@dataclass(frozen=True)
class Recording:
    """A session's recorded events, verified, and what the recording says about itself."""

    session_id: str
    events: list[Event]
    complete: bool
    """The final chunk is present: the recorded run finished."""
    fingerprint: str | None
    """The original run's causal fingerprint (on the final chunk), ``None`` when it ended early."""
    outcome: str
    chunks: int
    codec: int = 1
    """The argument codec its hashes were made with, and so the rules it is rerun by
    (:func:`~otel_replay.rerun.codec.codec_of_format`)."""
    output: str | None = None
    """The hash of what the recorded run returned, when the recording was told (``RecordMode.set_output``)."""
    match_key: bytes | None = field(default=None, repr=False)
    """The key its argument hashes are keyed with (codec 3 and later; see :func:`_match_key`)."""

    @property
    def rules(self) -> str:
        """What a rerun of this recording compares, when it is less than a recording made now (else ``""``)."""
        if self.codec >= 4:
            return ""
        if self.codec == 3:
            return (
                "recorded in format 3: a tool's default argument values (of the parameters a call left out) not "
                "compared; record again to compare them"
            )
        return (
            f"recorded in format {max(self.codec, 1)}: order across calls not compared, nor HTTP headers, the full "
            "unredacted URL and body, a method's receiver, or a tool's default argument values, and outcomes by "
            "exception name only; record again to compare them"
        )


def load_recording(store: Store, session_id: str) -> Recording:
    """The verified recording of ``session_id``.

    Raises:
        RecordNotFound: no recording chunk claims the session.
        UntrustedRecord: a chunk is unsealed, edited, or signed with an unknown key (the file is named).
        DatasetError: a chunk was made by a newer format version, a chunk in the middle is missing,
            or the events are malformed.

    """
    rows = store.run("rerun_events", session_id=session_id)
    if not rows:
        raise RecordNotFound(f"no recording for session {session_id!r} in {store.dataset}")
    check = store.seal_check
    chunks: dict[int, tuple[str, dict[str, object]]] = {}
    for row in rows:
        rec = stored_record(row)
        problem, _ = check.problem(rec)
        if problem is not None and problem.startswith(MISPLACED):
            # A verbatim copy at another span: the chunk itself is the row in its sealed span (if that one is
            # gone, the missing chunk is named below), so the copy is left out, as verify leaves it out.
            _log.warning("otel-replay: recording of session %r: ignoring %s [%s]", session_id, problem, rec.file)
            continue
        if problem is not None:
            raise UntrustedRecord(
                f"recording of session {session_id!r}: chunk {rec.record_id} refused ({problem}) [{rec.file}]; "
                "a tampered recording is not rerun"
            )
        attrs = dict(rec.attributes)
        version = attrs.get(sc.RECORDING_FORMAT)
        if not isinstance(version, int) or version > RECORDING_FORMAT:
            raise DatasetError(
                f"recording of session {session_id!r} (chunk {rec.record_id}) has format version {version!r}; "
                f"this otel-replay reads up to version {RECORDING_FORMAT}: upgrade otel-replay to rerun it"
            )
        index = attrs.get(sc.RECORDING_CHUNK)
        if not isinstance(index, int) or index < 0:
            raise DatasetError(f"recording chunk {rec.record_id} of session {session_id!r} has no chunk number")
        earlier = chunks.get(index)
        if earlier is not None and earlier[0] != rec.record_id:
            raise DatasetError(
                f"recording of session {session_id!r}: chunk {index} is claimed by two records "
                f"({earlier[0]}, {rec.record_id}); recorded twice under one session id?"
            )
        chunks[index] = (rec.record_id, attrs)
    _one_run(session_id, chunks)
    formats = {attrs.get(sc.RECORDING_FORMAT) for _, attrs in chunks.values()}
    if len(formats) > 1:
        raise DatasetError(f"recording of session {session_id!r} mixes format versions {sorted(map(str, formats))}")
    events: list[Event] = []
    complete = False
    fingerprint: str | None = None
    outcome = ""
    output: str | None = None
    for expected, index in enumerate(sorted(chunks)):
        record_id, attrs = chunks[index]
        if index != expected:
            raise DatasetError(
                f"recording of session {session_id!r}: chunk {expected} is missing (chunk {index} follows); "
                "the recording was cut in the middle"
            )
        where = f"recording chunk {record_id} of session {session_id!r}"
        try:
            data = strict_loads(str(attrs.get(sc.RECORDING_EVENTS, "[]")), where=where)
            batch = [Event.from_json(item, decoded=True) for item in data]
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:  # 1e400 is inf
            if isinstance(exc, PayloadError):
                raise DatasetError(str(exc)) from exc
            raise DatasetError(f"{where}: malformed event ({exc})") from exc
        for event in batch:
            if event.seq != len(events):
                raise DatasetError(f"{where}: event {event.seq} out of order (expected {len(events)})")
            events.append(event)
        if attrs.get(sc.RECORDING_FINAL) is True:
            complete = True
            value = attrs.get(sc.RECORDING_FINGERPRINT)
            fingerprint = str(value) if value else None
            outcome = str(attrs.get(sc.RECORDING_OUTCOME, ""))
            given = attrs.get(sc.RECORDING_OUTPUT)
            output = str(given) if given else None
            if index != max(chunks):
                raise DatasetError(f"{where}: marked final, yet chunk {max(chunks)} follows it")
    version = next(iter(formats), RECORDING_FORMAT)
    codec = codec_of_format(version if isinstance(version, int) else RECORDING_FORMAT)
    current = _current_fingerprint(fingerprint, events, codec)
    key = _match_key(store, session_id, chunks[0][1]) if codec >= 3 else None
    return Recording(session_id, events, complete, current, outcome, len(chunks), codec, output, key)


def _match_key(store: Store, session_id: str, first: dict[str, object]) -> bytes:
    """The argument-hash key of a recording: derived from the signing key its first chunk is sealed with.

    The rerun checked that seal, so it holds the key; a chunk accepted without its key (signature checks
    off) leaves the rerun unable to compare any argument, and is refused here, naming the key to supply.
    """
    key_id = str(first.get(sc.RECORD_KEY_ID, ""))
    signing = store.seal_check.keys.get(key_id)
    if signing is None:
        raise ConfigError(
            f"recording of session {session_id!r} is sealed with key {key_id}, which is not a verification key "
            "here; a rerun needs that key, as the recorded arguments are hashed with a key derived from it "
            "(set OTEL_REPLAY_SIGNING_KEY or OTEL_REPLAY_KEY_FILE, or pass --key-file)"
        )
    return match_key(signing.secret)


def fingerprint_version(codec: int) -> int:
    """The fingerprint version a recording of argument ``codec`` is compared by: 3 (order too) from codec 3 on."""
    return FINGERPRINT_VERSION if codec >= 3 else 2


def _current_fingerprint(stored: str | None, events: list[Event], codec: int) -> str | None:
    """The recording's fingerprint as a rerun computes it now.

    A format-3 recording stores its version-3 digest (order included), kept as stored. A recording made
    before fingerprint version 2 stores a version-1 digest: when it is exactly the version-1 digest of the
    recorded events, the recording is compared by its version-2 digest. Anything else is kept as stored (a
    rerun then does not match it, as before). Values are hashed with the recording's own argument ``codec``,
    as its rerun hashes them.
    """
    if stored is None or codec >= 3:
        return stored
    with arguments_codec(codec):
        current = _digest(events, 2)
        if stored != current and stored == _digest(events, 1):
            return current
    return stored


def _digest(events: list[Event], version: int) -> str:
    # Value hashes are computed here without caching them on the events: the rerun hashes them itself,
    # in its own setting, and must not be handed values hashed at load.
    fp = Fingerprint(version=version)
    for event in events:
        if not event.transparent:
            fp.add(event.stream, event.boundary, event.name, event.args_hash, value_hash(event.value, event.error))
    return fp.hexdigest()


def _one_run(session_id: str, chunks: dict[int, tuple[str, dict[str, object]]]) -> None:
    """Every chunk must come from one recording run: a sealed chunk of another run is not spliced in."""
    runs: dict[object, tuple[int, str]] = {}
    for index in sorted(chunks):
        record_id, attrs = chunks[index]
        runs.setdefault(attrs.get(sc.RECORDING_ID), (index, record_id))
    if len(runs) > 1:
        (first, (i, a)), (other, (j, b)) = list(runs.items())[:2]
        raise UntrustedRecord(
            f"recording of session {session_id!r}: chunk {j} ({b}) belongs to another recording ({other}) than "
            f"chunk {i} ({a}, recording {first}); a recording spliced from two runs is not rerun"
        )


def recorded_sessions(store: Store) -> list[dict[str, object]]:
    """Every session with a recording (id, chunks, finished, fingerprint, recorded_at), oldest first."""
    return store.run("rerun_sessions")
