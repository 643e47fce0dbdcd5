"""Secret redaction for captured content (prompts, completions, tool arguments and results).

Content leaves the process only through :func:`scrub`: the value is rendered
as text, every secret-shaped substring is replaced by ``[REDACTED]``, and the
text is capped. If anything in that goes wrong the content is dropped (``None``),
never written unredacted; the drop is counted in :data:`stats`.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from typing import Any, Final

__all__ = ["MAX_CONTENT_CHARS", "REDACTED", "ContentStats", "redact", "scrub", "stats"]

_log = logging.getLogger(__name__)

REDACTED: Final = "[REDACTED]"
MAX_CONTENT_CHARS: Final = 32_768
"""Captured content longer than this is cut, with a marker saying how much was cut."""
_SCAN_CHARS: Final = 4 * MAX_CONTENT_CHARS
"""Only this much is scanned for secrets; the rest is cut before scanning (so a cut never splits a secret
that was then left unredacted: the cut to MAX_CONTENT_CHARS happens after redaction)."""

# Every token-shaped rule starts with a look-behind that admits only the first character of a run (not
# every position inside it): a rule that scans a long run and then fails is tried once per run, so the
# whole pass stays linear in the text's length whatever the text (no catastrophic backtracking).
_RUN = r"(?<![A-Za-z0-9_.+-])"

# (pattern, replacement). Order matters: whole PEM blocks first, then credentials inside URLs,
# then token shapes, then key=value pairs.
_RULES: Final[tuple[tuple[re.Pattern[str], str], ...]] = (
    (
        re.compile(
            r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY-----(?:.*?-----END[A-Z0-9 ]{0,40}PRIVATE KEY-----|.*\Z)", re.DOTALL
        ),
        REDACTED,
    ),
    (
        re.compile(_RUN + r"([a-zA-Z][a-zA-Z0-9+.-]{1,20}://)([^\s:/@\"']{1,256}):([^\s@/\"']{1,256})@"),
        r"\1\2:" + REDACTED + "@",
    ),
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 " + REDACTED),
    (re.compile(_RUN + r"sk-(?:ant-|proj-)?[A-Za-z0-9_-]{16,}"), REDACTED),
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), REDACTED),
    (re.compile(_RUN + r"AIza[0-9A-Za-z_-]{35}"), REDACTED),
    # A URL query parameter named like a credential: ?key=, &sig=, X-Amz-Signature=, X-Amz-Credential= ...
    (
        re.compile(
            r"(?i)([?&](?:[a-z0-9]+[_.-])*"
            r"(?:key|apikey|sig|signature|credentials?|token|secret|password|passwd|pwd|auth|authorization|session[_-]?id)=)([^&#\s\"']{1,2048})"
        ),
        r"\1" + REDACTED,
    ),
    (re.compile(_RUN + r"gh[pousr]_[A-Za-z0-9]{30,}"), REDACTED),
    (re.compile(_RUN + r"xox[abprs]-[A-Za-z0-9-]{10,}"), REDACTED),
    (re.compile(_RUN + r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), REDACTED),
    (
        re.compile(
            r"(?i)(" + _RUN + r"(?:[a-z0-9]+[_-])*(?:api[_-]?key|secret|password|passwd|pwd|token|access[_-]?key|"
            r"auth(?:orization)?|private[_-]?key)\b[\"']?\s*[:=]\s*[\"']?)([^\s\"',;}&]{3,})"
        ),
        r"\1" + REDACTED,
    ),
)


class ContentStats:
    """Counts of content dropped because it could not be rendered or redacted."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.dropped = 0

    def drop(self) -> None:
        """Count one dropped piece of content."""
        with self._lock:
            self.dropped += 1


stats = ContentStats()


def redact(text: str) -> str:
    """``text`` with every secret-shaped substring replaced by ``[REDACTED]``."""
    for pattern, replacement in _RULES:
        text = pattern.sub(replacement, text)
    return text


def _render(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=_fallback, allow_nan=False)


def _fallback(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json", exclude_none=True)
    if isinstance(value, bytes | bytearray):
        return f"<{len(value)} bytes>"
    return repr(value)


def scrub(value: Any) -> str | None:
    """``value`` rendered as text, redacted and capped; ``None`` (and counted) when that fails."""
    try:
        text = _render(value)
        if len(text) > _SCAN_CHARS:
            text = text[:_SCAN_CHARS]
        text = redact(text)
        if len(text) > MAX_CONTENT_CHARS:
            cut = len(text) - MAX_CONTENT_CHARS
            text = f"{text[:MAX_CONTENT_CHARS]}…[{cut}+ chars cut]"
        return text
    except Exception as exc:  # never write content we could not redact
        stats.drop()
        _log.debug("otel-replay: content dropped, it could not be rendered or redacted: %s", exc)
        return None
