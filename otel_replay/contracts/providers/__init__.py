"""What governance needs to know of each client library: how a request offers tools, how a response asks for them.

One :class:`~otel_replay.contracts.providers.base.Adapter` per API: it reads the tools a request offers and
rewrites that list (narrowing), reads the tool results a request carries back (``with_output``), reads the
tool calls, model and usage of a response, and strips refused calls from it. :func:`detect` tells a client's
provider by its class.
"""

from __future__ import annotations

from otel_replay.contracts.providers.base import Adapter, ToolResultSeen, detect

__all__ = ["Adapter", "ToolResultSeen", "detect"]
