r"""The characters that draw nothing or mislead, which every view of recorded text shows as escapes.

DEL and the C1 controls, bidirectional controls, line and paragraph
separators; the characters that draw nothing (soft hyphen, zero-width space
and joiners, word joiner and invisible operators, byte order mark, Mongolian
vowel separator, the tag characters that spell hidden ASCII), so two ids that
differ only by one do not look the same; and lone surrogates, which no page or
terminal encoding can hold. The C0 controls are each view's own to add (a page
keeps tab and newline; JSON escapes them itself). One set, so the terminal's
tables (:mod:`otel_replay.cli.render`) and the report pages
(:mod:`otel_replay.report.html`) show the same characters.
"""

from __future__ import annotations

__all__ = ["INVISIBLE", "escape_code"]

INVISIBLE = (
    "\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028\u2029\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff"
    "\ud800-\udfff\U000e0000-\U000e007f"
)
"""The set, as the inside of a regular-expression character class."""


def escape_code(code: int) -> str:
    r"""A character's escape as shown: ``\uXXXX``, or ``\UXXXXXXXX`` past the first plane."""
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
