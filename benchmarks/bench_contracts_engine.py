"""The contract engine's share of a governed model call, and what saving the session state adds.

Run: python benchmarks/bench_contracts_engine.py [--responses N] [--rounds N]

One "response" is what a governed call asks of the engine: narrow the 10 offered tools, the pre-check,
evaluate a response of 3 tool calls (each with argument invariants: a regex, bounds, one_of), and finalize
the decision (10 contracts loaded, loop detection and per-tool limits on). Variants, alternating in the
same process, best of ``--rounds``, in CPU microseconds per response:

* ``engine``: the four engine steps on a state in memory;
* ``engine + memory store``: the same inside ``MemoryStateStore.update`` (a JSON round trip of the state);
* ``engine + file store``: the same inside ``FileStateStore.update`` (SQLite in WAL mode, ``BEGIN
  IMMEDIATE``, commit with an fsync; the file in a temporary directory); ``... no fsync``: ``fsync=False``;
* peer ``parse only``: ``json.loads`` of the 3 argument texts, the floor any gate pays to read them;
* peers ``sqlite commit`` / ``sqlite commit, no fsync``: a bare SQLite ``UPDATE`` + commit of a state text
  (changed each time: SQLite skips writing a page whose bytes did not change) in a file set up the same way.

Prints figures and ratios; asserts nothing. Target (issue 22): ``govern`` adds under 200 µs per model call.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from otel_replay.contracts.engine import Engine, ToolCallView
from otel_replay.contracts.model import (
    ArgumentInvariant,
    ContractSet,
    LoopDetection,
    Price,
    SessionContract,
    SessionLimits,
    Source,
    ToolContract,
)
from otel_replay.contracts.state import SessionState
from otel_replay.contracts.store import FileStateStore, MemoryStateStore

TOOLS = 10


def contracts() -> ContractSet:
    """Ten tools with invariants; a session with loop detection, per-tool limits and a priced cost cap."""
    tools = {}
    for number in range(TOOLS):
        name = f"tool_{number}"
        here = Source(f"{name}.yaml", 1)
        tools[name] = ToolContract(
            tool=name,
            source=here,
            side_effect="read",
            argument_value_invariants=(
                ArgumentInvariant(path="$.email", source=here, regex=r"^[^@\s]+@[^@\s]+$", max_length=254),
                ArgumentInvariant(path="$.amount", source=here, gt=0, lte=500),
                ArgumentInvariant(path="$.currency", source=here, one_of=("USD", "EUR", "GBP")),
            ),
        )
    session = SessionContract(
        source=Source("session.yaml", 1),
        session_limits=SessionLimits(
            max_cost_per_session=1e9,
            max_calls_per_tool={"tool_9": 10**9},
            loop_detection=LoopDetection(window=5, threshold=3, source=Source("session.yaml", 9)),
        ),
        prices={"m": Price(0.15, 0.60, Source("session.yaml", 20))},
    )
    return ContractSet(directory=Path("contracts"), session=session, tools=tools, digest="bench")


def response(number: int) -> list[ToolCallView]:
    """Three valid calls with arguments unique to ``number`` (no loop)."""
    return [
        ToolCallView.parse(
            i,
            f"call_{number}_{i}",
            f"tool_{i * 3}",
            json.dumps({"email": f"user{number}@example.test", "amount": 10 + i, "currency": "EUR", "n": number}),
        )
        for i in range(3)
    ]


def main() -> int:
    """Run the variants alternately and print µs per response."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--responses", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    engine = Engine(contracts(), gate="strip_blocked")
    offered = [f"tool_{n}" for n in range(TOOLS)]
    inputs = [response(n) for n in range(args.responses)]
    texts = [[c.arguments_text for c in calls] for calls in inputs]

    def step(state: SessionState, calls: list[ToolCallView]) -> SessionState:
        engine.narrow(state, offered)
        if engine.precheck(state, "m"):
            raise SystemExit("benchmark state hit a limit")
        decision = engine.evaluate(state, calls)
        if decision.outcome != "allow":
            raise SystemExit(f"benchmark response blocked: {decision.failures[:1]}")
        engine.finalize(state, decision, model="m", usage=(1200, 80))
        return state

    with tempfile.TemporaryDirectory() as scratch:
        file_store = FileStateStore(Path(scratch) / "sessions.sqlite3")
        lax_store = FileStateStore(Path(scratch) / "lax.sqlite3", fsync=False)
        memory_store = MemoryStateStore()
        peers = {}
        for sync in ("FULL", "NORMAL"):
            peer = sqlite3.connect(Path(scratch) / f"peer-{sync}.sqlite3", isolation_level=None)
            peer.execute("PRAGMA journal_mode = WAL")
            peer.execute(f"PRAGMA synchronous = {sync}")
            peer.execute("CREATE TABLE s (id TEXT PRIMARY KEY, state TEXT)")
            peer.execute("INSERT INTO s VALUES ('s', '')")
            peers[sync] = peer
        run_id = [0]

        def engine_only() -> None:
            state = engine.new_state("s", None)
            for calls in inputs:
                step(state, calls)

        def with_store(store: FileStateStore | MemoryStateStore) -> Callable[[], None]:
            def run() -> None:
                run_id[0] += 1
                session = f"s{run_id[0]}"
                for calls in inputs:
                    store.update(session, lambda s, c=calls: step(s or engine.new_state(session, None), c))

            return run

        state_text = engine.new_state("s", None).to_json()

        def parse_only() -> None:
            for group in texts:
                for text in group:
                    json.loads(text)

        def sqlite_commit(peer: sqlite3.Connection) -> Callable[[], None]:
            def run() -> None:
                for number in range(len(inputs)):
                    peer.execute("BEGIN IMMEDIATE")
                    peer.execute("UPDATE s SET state = ? WHERE id = 's'", (f"{state_text}{number}",))
                    peer.execute("COMMIT")

            return run

        variants: dict[str, Callable[[], None]] = {
            "engine": engine_only,
            "engine + memory store": with_store(memory_store),
            "engine + file store": with_store(file_store),
            "engine + file, no fsync": with_store(lax_store),
            "peer: parse only": parse_only,
            "peer: sqlite commit": sqlite_commit(peers["FULL"]),
            "peer: sqlite, no fsync": sqlite_commit(peers["NORMAL"]),
        }
        best = dict.fromkeys(variants, float("inf"))
        best_wall = dict.fromkeys(variants, float("inf"))
        for _ in range(args.rounds):
            for name, run in variants.items():
                cpu, wall = time.process_time(), time.perf_counter()
                run()
                best[name] = min(best[name], (time.process_time() - cpu) / args.responses * 1e6)
                best_wall[name] = min(best_wall[name], (time.perf_counter() - wall) / args.responses * 1e6)
        file_store.close()
        lax_store.close()
        for peer in peers.values():
            peer.close()
    load = os.getloadavg()
    print(f"{args.responses} responses x {args.rounds} rounds; load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    for name in variants:
        print(f"{name:26s} {best[name]:8.1f} µs CPU  {best_wall[name]:8.1f} µs wall per response")
    print(f"engine / parse only:            {best['engine'] / best['peer: parse only']:.1f}x")
    for store, peer_name in (
        ("engine + file store", "peer: sqlite commit"),
        ("engine + file, no fsync", "peer: sqlite, no fsync"),
    ):
        added = best_wall[store] - best_wall["engine"]
        print(f"{store} adds {added:.1f} µs wall ({added / best_wall[peer_name]:.2f}x {peer_name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
