"""A file-backed rail for cross-process gate tests: every refund lands in one JSON file.

Configured by environment variables so ``otel-replay replay --rail tests.rails:file_ledger``
in a subprocess uses the same ledger as the test:

* ``OTEL_REPLAY_TEST_LEDGER``: the ledger file (required);
* ``OTEL_REPLAY_TEST_DELAY``: seconds ``compensate`` takes before refunding (outside any lock,
  so without the gate's claims concurrent callers would all refund);
* ``OTEL_REPLAY_TEST_CRASH``: ``1`` makes ``compensate`` kill the process before refunding.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any


class FileLedger:
    def __init__(self, path: Path) -> None:
        self.path = path

    def _update(self, change) -> Any:
        with open(self.path.with_suffix(".lock"), "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = json.loads(self.path.read_text()) if self.path.exists() else {"refunds": [], "keys": []}
            result = change(state)
            self.path.write_text(json.dumps(state))
            return result

    def commit(self, action) -> Any:
        from otel_replay import Receipt

        return Receipt(f"rcpt-{os.getpid()}-{time.time_ns()}", action.type, float(action.cost or 0))

    def compensate(self, receipt, *, idempotency_key: str) -> None:
        if os.environ.get("OTEL_REPLAY_TEST_CRASH") == "1":
            os._exit(17)  # dies between the gate's claim and the rail's answer
        time.sleep(float(os.environ.get("OTEL_REPLAY_TEST_DELAY", "0")))

        def refund(state: dict[str, Any]) -> None:
            if idempotency_key in state["keys"]:
                return  # a retry of a refund already made: nothing more
            state["keys"].append(idempotency_key)
            state["refunds"].append({"receipt": receipt.receipt_id, "pid": os.getpid(), "amount": receipt.amount})

        self._update(refund)

    def refunds(self) -> list[dict[str, Any]]:
        return json.loads(self.path.read_text())["refunds"] if self.path.exists() else []


def file_ledger() -> FileLedger:
    return FileLedger(Path(os.environ["OTEL_REPLAY_TEST_LEDGER"]))
