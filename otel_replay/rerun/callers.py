"""Whose call is it? Library internals read the clock and entropy too; only the agent's reads are recorded.

A clock or entropy read is attributed to the module of the frame that made
it. Reads made by the standard library, by OpenTelemetry, by otel-replay
itself (except the correlation scopes, whose made-up ids key the streams) and by
the HTTP and model client libraries are their own business
(span timestamps, id generation, connection-pool timeouts, the event loop's
clock): they are neither recorded nor served. Everything else is the agent's.
"""

from __future__ import annotations

import sys
from contextvars import ContextVar
from types import FrameType

from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY, get_value

from otel_replay.rerun.codec import current_codec

__all__ = ["INSIDE", "agent_module", "exporters_traffic", "suppressed"]

INSIDE: ContextVar[bool] = ContextVar("otel_replay_rerun_inside", default=False)
"""True while a boundary call is in progress: nested crossings belong to it and pass straight through."""

_LIBRARIES = (
    "opentelemetry",
    "otel_replay",
    "httpx",
    "httpx2",
    "httpcore",
    "h11",
    "h2",
    "anyio",
    "sniffio",
    "urllib3",
    "requests",
    "openai",
    "anthropic",
    "pydantic",
    "pydantic_core",
    "wrapt",
    "duckdb",
    "pyarrow",
    "grpc",
    "google",
    "_pytest",
    "pytest",
    "pluggy",
    "click",
    "certifi",
    "idna",
    "charset_normalizer",
    "distro",
    "jiter",
    "vcr",
    "tqdm",
)
"""The libraries of codec 1 and 2 recordings (a rerun of one attributes calls with this list, as it was recorded)."""
_LIBRARIES_3 = (
    *_LIBRARIES,
    "httpcore2",  # the fork httpx2 (and so openai) imports: reads its version and the clock at call time
    "truststore",
    "typing_extensions",
    "typing_inspection",
    "annotated_types",
    "docstring_parser",
    "zstandard",
    "brotli",
    "brotlicffi",
    "socksio",
    "hpack",
    "hyperframe",
    "exceptiongroup",
    "_distutils_hack",
)
"""Codec 3 on: also what the installed openai, anthropic and httpx stacks run at call time."""
_RECORDED_INTERNALS = ("otel_replay.demo", "otel_replay.capture.context")
"""otel-replay modules whose draws are the agent's: a correlation or session id made up by
``otel_replay.correlation()`` must come back the same in a rerun (streams are keyed on it)."""
_cache: dict[tuple[str, bool], bool] = {}
_stdlib = frozenset(sys.stdlib_module_names) - {"__main__"}


def agent_module(module: str) -> bool:
    """Whether a call made from ``module`` is the agent's (recorded) rather than a library's."""
    recent = current_codec() >= 3
    known = _cache.get((module, recent))
    if known is not None:
        return known
    top = module.partition(".")[0]
    libraries = _LIBRARIES_3 if recent else _LIBRARIES
    mine = module in _RECORDED_INTERNALS or not (
        top in _stdlib or top in libraries or (recent and top.startswith(("namedtuple_", "__editable__")))
    )
    if len(_cache) < 100_000:
        _cache[(module, recent)] = mine
    return mine


def suppressed() -> bool:
    """OpenTelemetry's 'suppress instrumentation' flag (set by exporters while they send) is on."""
    return bool(get_value(_SUPPRESS_INSTRUMENTATION_KEY))


_EXPORT_MODULES = ("opentelemetry.sdk.", "opentelemetry.exporter.", "otel_replay.exporters.")
"""Where exports run from: the SDK's span, log and metric processors (batch threads, and ``on_end`` on the
caller's thread), the exporters themselves, and otel-replay's own writer."""


def _exporter_method(frame: FrameType) -> bool:
    """``frame`` runs ``export`` of an object whose class derives from an SDK exporter (custom ones included)."""
    if frame.f_code.co_name != "export":
        return False
    owner = frame.f_locals.get("self")
    return owner is not None and any(
        base.__name__.endswith("Exporter") and base.__module__.startswith("opentelemetry.sdk.")
        for base in type(owner).__mro__
    )


def exporters_traffic() -> bool:
    """Whether the call being made is telemetry export traffic, which is never recorded, served or guarded.

    The suppression flag alone does not say so: exporters set it, but so do agents and frameworks that
    keep noisy spans out (``suppress_instrumentation()``), and their calls must be recorded. So a call is
    the exporter's only when the flag is on *and* an SDK processor, an exporter module or the ``export``
    method of an SDK exporter subclass (a custom exporter in the agent's own package) is on the stack.
    A stack with no frame of the agent's is not enough: ``asyncio.to_thread(requests.get, url)`` under
    the flag runs in a worker whose stack is the standard library's and requests' alone, and that call is
    the agent's.
    """
    if not get_value(_SUPPRESS_INSTRUMENTATION_KEY):
        return False
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if (isinstance(module, str) and module.startswith(_EXPORT_MODULES)) or _exporter_method(frame):
            return True
        frame = frame.f_back
    return False
