"""The id a stored receipt is named by: one definition for the gate, which stores receipts, and ``verify``."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from otel_replay._json import canonical_json

__all__ = ["receipt_id_of"]


def receipt_id_of(stored: Any) -> str:
    """The id of a stored receipt: ``receipt_id``, ``id``, itself, or a digest.

    A string or int ``receipt_id`` names it; without one, a string or int
    ``id``, what most payment APIs name a charge by (Stripe's ``{"id": "ch_..."}``);
    a string or int receipt names itself.
    The digest (``sha256:`` and 32 hex) names a receipt that carries neither,
    the same way before and after it was stored: its identity is its content.
    """
    if stored.__class__ is dict or isinstance(stored, Mapping):  # a dict without the ABC check
        rid = _id_field(stored.get("receipt_id"))
        if rid is None and stored.get("receipt_id") is None:
            rid = _id_field(stored.get("id"))
    else:
        rid = _id_field(stored)
    if rid is not None:
        return rid
    text = canonical_json(stored, where="gate receipt")
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return f"sha256:{digest[:32]}"


def _id_field(value: Any) -> str | None:
    """``value`` as an id when it is a string or an int (not a bool); else ``None``."""
    return str(value) if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)) else None
