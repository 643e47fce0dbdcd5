"""How a rerun says where it diverged: the :class:`Divergence`, the calls described, the closest recorded ones.

A divergence names the recorded step, why the call differs, the recorded call and the rerun's, each described
on one line (an HTTP call's stored text without its part digests), and the closest recorded calls scored by the
matchers they pass: for an HTTP call method, host, path, query, headers and body (by their part digests when
the recording holds them, so a redacted part still shows where it differs); for a clock or entropy read its
name, its consumer (the function that made the read: such reads are served per consumer) and its arguments.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from otel_replay._seam import Call
from otel_replay.errors import ReplayMismatchError
from otel_replay.rerun.codec import stable_json
from otel_replay.rerun.events import Event, describe_event
from otel_replay.rerun.http_match import part_differences, split_parts

__all__ = [
    "Divergence",
    "capped_reason",
    "compare_candidate",
    "consumer",
    "describe",
    "describe_call",
    "describe_text",
    "first_difference",
    "mismatch_at",
]


@dataclass(frozen=True)
class Divergence:
    """The first step where the rerun did not do what the recording holds.

    ``step`` is numbered as the recording numbers its events (the ``step N`` of the closest recorded calls):
    the recorded event the call took, the one the recording made at that point when the call came out of
    order, or, for a call the recording does not hold, where the rerun had reached.
    """

    step: int
    reason: str
    expected: str
    actual: str
    candidates: tuple[str, ...] = ()

    def __str__(self) -> str:
        lines = [
            f"diverged at step {self.step}: {self.reason}",
            f"  recorded: {self.expected or '(nothing: the recording holds no such call)'}",
            f"  rerun:    {self.actual or '(nothing: the rerun never made this call)'}",
        ]
        if self.candidates:
            lines.append("  closest recorded calls:")
            lines.extend(f"    {c}" for c in self.candidates)
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form (stored with the rerun record)."""
        return {
            "step": self.step,
            "reason": self.reason,
            "expected": self.expected,
            "actual": self.actual,
            "candidates": list(self.candidates),
        }


def consumer(stream: str) -> str:
    """The consumer part of a stream key (the function that made a clock or entropy read; "" when none)."""
    parts = stream.split("|")
    return parts[2] if len(parts) > 2 else ""


def describe(event: Event) -> str:
    """One line for a recorded event, as a divergence shows it."""
    return describe_call(event.boundary, event.name, event.stream, event.arguments)


def _shown(boundary: str, arguments: str) -> str:
    """The arguments as shown: an HTTP call's without its part digests."""
    return split_parts(arguments)[0] if boundary == "http" else arguments


def describe_text(boundary: str, name: str, arguments: str) -> str:
    """One line for a call with these stored arguments (an HTTP call's shown without its part digests)."""
    return describe_event(boundary, name, _shown(boundary, arguments))


def describe_call(boundary: str, name: str, stream: str, arguments: str) -> str:
    """:func:`describe_text`, naming the consumer of a clock or entropy read."""
    who = consumer(stream)
    text = describe_text(boundary, name, arguments)
    return f"{text} (in {who})" if who and boundary in ("clock", "entropy") else text


def _http_parts(arguments: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The shown parts of stored HTTP arguments, and their part digests (``None``: codec 1 and 2 hold none)."""
    try:
        data = json.loads(arguments)
        url = urlsplit(str(data.get("url", "")))
    except (ValueError, AttributeError):
        return {}, None
    digests = data.get("digests")
    if not isinstance(digests, dict) or not isinstance(digests.get("headers"), dict):
        digests = None
    return {
        "method": data.get("method"),
        "host": f"{url.scheme}://{url.netloc}",
        "path": url.path,
        "query": url.query,
        "body": stable_json(data.get("body")),
    }, digests


def compare_candidate(candidate: Event, boundary: str, name: str, stream: str, arguments: str) -> tuple[int, str]:
    """Score a recorded candidate against the rerun's call; text lists the matchers passed (✓) and failed (✗).

    An HTTP call recorded with part digests (codec 3) is judged by them, headers included, so a part whose
    stored text is redacted (a credential, a secret query value) still shows where it differs.
    """
    if boundary == "http":
        (have, recorded), (want, made) = _http_parts(candidate.arguments), _http_parts(arguments)
        if recorded is not None and made is not None:
            differ = part_differences(recorded, made)
            headers = [word.removeprefix("header ") for word in differ if word.startswith("header ")]
            checks = [(key, key not in differ, have.get(key)) for key in ("method", "host", "path", "query")]
            checks.append(("headers", not headers, "differing: " + ", ".join(headers)))
            checks.append(("body", "body" not in differ, have.get("body")))
        else:
            checks = [
                (key, have.get(key) == want.get(key), have.get(key))
                for key in ("method", "host", "path", "query", "body")
            ]
    else:
        checks = [
            ("name", candidate.name == name, candidate.name),
            # clock and entropy reads are served per consumer: the function that made the call
            ("consumer", consumer(candidate.stream) == consumer(stream), consumer(candidate.stream) or "(none)"),
            ("arguments", candidate.arguments == arguments, candidate.arguments),
        ]
    passed = sum(ok for _, ok, _ in checks)
    marks = " ".join(f"{'✓' if ok else '✗'} {key}" for key, ok, _ in checks)
    failed = "; ".join(
        f"{key} {value}" if key == "headers" else f"{key} recorded {str(value)[:80]!r}"
        for key, ok, value in checks
        if not ok
    )
    return passed, f"step {candidate.seq}: {describe(candidate)} [{marks}]" + (f" ({failed})" if failed else "")


def first_difference(recorded: str, actual: str, width: int = 70, redacted: str = "") -> tuple[str, str]:
    """Both texts cut to a window around their first differing character, so the change is visible.

    ``redacted``: the parts that differ, in words (from an HTTP call's part digests): said instead of
    pointing at a character when the texts shown are equal because what differs is redacted in them, and
    after the character otherwise.
    """
    if redacted and recorded == actual:
        cut_text = recorded if len(recorded) <= width else recorded[: width - 1] + "…"
        return f"{cut_text} (the difference is in a redacted value: {redacted})", cut_text
    limit = min(len(recorded), len(actual))
    at = next((i for i in range(limit) if recorded[i] != actual[i]), limit)
    start = max(0, at - width // 2)

    def cut(text: str) -> str:
        piece = text[start : start + width]
        return ("…" if start else "") + piece + ("…" if start + width < len(text) else "")

    parts = f"; the parts that differ: {redacted}" if redacted else ""
    return f"{cut(recorded)} (first difference at character {at}{parts})", cut(actual)


def capped_reason(capped: dict[str, Any]) -> str:
    """Why a recorded response cannot be served as it came (a divergence's reason)."""
    if capped.get("undecodable"):
        return (
            f"the recorded response's {capped.get('original_bytes')} encoded bytes could not be decoded "
            f"({capped['undecodable']}); its body was not stored and is served empty"
        )
    total = f"at least {capped.get('original_bytes')}" if capped.get("at_least") else f"{capped.get('original_bytes')}"
    return (
        f"the recorded response was capped at {capped.get('recorded_bytes')} of {total} bytes "
        "(OTEL_REPLAY_RERUN_MAX_BODY); it is served cut short"
    )


def mismatch_at(step: int, reason: str, call: Call, text: str, event: Event) -> ReplayMismatchError:
    """The error at step ``step`` of a served call: ``reason``, the recorded ``event`` against the call made."""
    return ReplayMismatchError(
        f"step {step}: {reason}",
        step=step,
        expected=describe(event),
        actual=describe_text(call.boundary, call.name, text),
    )
