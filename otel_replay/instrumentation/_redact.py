"""Secret redaction for captured content: the names of :mod:`otel_replay.redaction`, where the engine lives.

Content leaves the process only through :func:`scrub`: the value is rendered
as text, every secret is replaced by ``[REDACTED]``, and the text is capped. If
anything in that goes wrong the content is dropped (``None``), never written
unredacted; the drop is counted in :data:`stats`.
"""

from __future__ import annotations

from otel_replay.redaction import _SCAN_CHARS as _SCAN_CHARS  # read by the HTTP body hooks from here
from otel_replay.redaction import MAX_CONTENT_CHARS, REDACTED, ContentStats, redact, scrub, stats

__all__ = ["MAX_CONTENT_CHARS", "REDACTED", "ContentStats", "redact", "scrub", "stats"]
