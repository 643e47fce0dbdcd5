r"""Worst-case CPU of a contract's ``regex`` on the model's text, and what refusing the slow ones costs at load.

Run: python benchmarks/bench_contracts_regex.py [--rounds N] [--base TREE] [--slow]

Three phases, each pattern compiled with ``compile_regex`` (as the loader does) and run with ``search`` (as
an argument invariant does), CPU milliseconds of this process, best of ``--rounds``:

* ``kept``: patterns with two repetitions that can share a text (or the search's start and one), accepted,
  on their worst text of ``REGEX_MAX_CHARS`` (8192) characters: one the pattern almost matches, ending in
  a character that makes it fail, so every split between the two is tried;
* ``refused``: patterns with three or more, on worst texts of growing length (200/400/800 characters; 100
  and 200 for the n**4 one, 400 with ``--slow``): the time where the code accepts them (``--base``), or the
  refusal's message where it refuses them;
* ``load``: ``compile_regex`` of each pattern (the static checks included), microseconds, the first time and
  again (this code caches the checks' answer by pattern: the loader and each engine ask for the same ones).

``--base TREE`` (a checkout, e.g. ``git archive s13-start | tar -x -C /tmp/base``) runs the same phases in a
child with ``PYTHONPATH=TREE`` before and after this code's own, alternately, and prints each with the
``otel_replay`` it imported. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable

KEPT: tuple[tuple[str, str], ...] = (
    (r"^.*-.*$", "-" * 8191 + "\n"),
    (r"^.*?-.*?$", "-" * 8191 + "\n"),
    (r"^a*a*$", "a" * 8191 + "!"),
    (r"^a*?a*?$", "a" * 8191 + "!"),
    (r"^\w+\d+$", "1" * 8191 + "!"),
    (r".*x", "a" * 8192),
    (r"\d*x", "1" * 8192),
    (r"^.+@.+", "@" * 8191 + "\n"),  # the seed's customer_email
)
REFUSED: tuple[tuple[str, str, str, tuple[int, ...]], ...] = (
    (r"^\w*\d*\w*x$", "1", "!", (200, 400, 800)),
    (r".*-.*$", "-", "\n", (200, 400, 800)),
    (r"^.*-.*-.*-.*$", "-", "\n", (100, 200)),
)
SHIPPED: tuple[str, ...] = (r"^[^@ ]+@[^@ ]+$", r"^ORD-[0-9]+$", r"^[^@\s]+@[^@\s]+$", r"^C[0-9]+$", r"^.+@.+")


def _best(rounds: int, run: Callable[[], object]) -> float:
    """The least CPU seconds of ``rounds`` calls of ``run``."""
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        run()
        best = min(best, time.process_time() - started)
    return best


def phases(rounds: int, slow: bool) -> None:
    """Print the three phases for the ``otel_replay`` this process imports."""
    import otel_replay  # noqa: PLC0415 - imported here so --base can point a child at another tree
    from otel_replay.contracts import checks  # noqa: PLC0415 - the same

    compile_regex = checks.compile_regex

    print(f"otel_replay from {os.path.dirname(otel_replay.__file__)}")
    print("kept, worst text of 8192 characters (CPU ms, search):")
    for pattern, text in KEPT:
        compiled = compile_regex(pattern)
        print(f"  {pattern:16} {_best(rounds, lambda c=compiled, t=text: c.search(t)) * 1000:9.1f}")
    print("refused here or not, worst text by length (CPU ms, search):")
    for pattern, unit, tail, lengths in REFUSED:
        try:
            compiled = compile_regex(pattern)
        except re.error as exc:
            print(f"  {pattern:16} refused: {str(exc)[:110]}...")
            continue
        sizes = (*lengths, lengths[-1] * 2) if slow else lengths
        shown = []
        for length in sizes:
            text = unit * (length - 1) + tail
            shown.append(f"{length}: {_best(rounds, lambda c=compiled, t=text: c.search(t)) * 1000:.1f}")
        print(f"  {pattern:16} " + "  ".join(shown))
    # The analysis is cached by pattern where there is a cache: "first" clears it before each call.
    cache_clear = getattr(getattr(checks, "_slowness", None), "cache_clear", lambda: None)
    print("load, compile_regex (CPU us, first time / again; a refusal raises):")
    for pattern in dict.fromkeys((*SHIPPED, *(kept for kept, _ in KEPT), *(refused for refused, *_ in REFUSED))):

        def load(pattern: str = pattern, clear: bool = False) -> None:
            if clear:
                cache_clear()
            try:
                checks.compile_regex(pattern)
            except re.error:
                pass

        first = _best(max(rounds, 20), lambda load=load: load(clear=True)) * 1e6
        print(f"  {pattern:16} {first:9.1f} {_best(max(rounds, 20), load) * 1e6:9.1f}")


def main() -> None:
    """Run the phases here, or alternately here and in ``--base``'s tree."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--base", help="another tree to run the same phases in, alternately")
    parser.add_argument("--slow", action="store_true", help="one longer text for each refused pattern")
    parser.add_argument("--here", action="store_true", help=argparse.SUPPRESS)  # a child's run: no more children
    args = parser.parse_args()
    if args.base is None or args.here:
        phases(args.rounds, args.slow)
        return
    command = [sys.executable, __file__, "--here", "--rounds", str(args.rounds), *(["--slow"] if args.slow else [])]
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for label, tree in (("base", args.base), ("this", here), ("base", args.base), ("this", here)):
        print(f"=== {label} ===", flush=True)
        subprocess.run(command, env={**os.environ, "PYTHONPATH": tree}, check=True)


if __name__ == "__main__":
    main()
