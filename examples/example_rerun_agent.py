"""Record an agent run once, then rerun it offline from the dataset alone and prove it matched.

The agent reads the clock, draws random numbers, a uuid and a token, calls an
HTTP API (httpx and requests) on a local server whose answers change on every
call, and asks a model through the real ``openai`` client against a local
scripted OpenAI-compatible endpoint. Then it decides and acts under ``audit()``.

Run: ``python examples/example_rerun_agent.py [DATASET_DIR]``. The script
records one session, stops both servers, reruns the agent from the dataset,
prints both fingerprints and whether the outputs are identical, then reruns a
changed agent (one word added to the prompt) and prints the first divergent step.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import random
import secrets
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import openai
import requests

import otel_replay
from otel_replay import Action, DependencySnapshot
from otel_replay.rerun import recording, rerun

API_KEY = "sk-example-0123456789abcdefghijkl"


class _Handler(BaseHTTPRequestHandler):
    server: _ScriptedServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, payload: dict[str, Any], status: int = 200) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Set-Cookie", "session=abc123")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        n = self.server.tick()
        if self.path.startswith("/quote"):
            self._send({"symbol": "ACME", "price": round(100 + 1.5 * n, 2), "served": n})
        elif self.path.startswith("/status"):
            self._send({"market": "open" if n % 2 else "busy", "served": n})
        else:
            self._send({"error": "no such path"}, 404)

    def do_POST(self) -> None:
        n = self.server.tick()
        length = int(self.headers.get("Content-Length") or 0)
        try:
            request = json.loads(self.rfile.read(length) or b"{}")
        except (ValueError, RecursionError):
            request = {"unreadable": True}
        if not isinstance(request, dict):
            request = {"value": "not an object"}
        if self.path.endswith("/chat/completions"):
            prompt = request["messages"][-1]["content"]
            self._send(
                {
                    "id": f"chatcmpl-{n}",
                    "object": "chat.completion",
                    "created": 1_700_000_000 + n,
                    "model": request.get("model", "scripted"),
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "stop",
                            "message": {"role": "assistant", "content": f"BUY (answer #{n} to {len(prompt)} chars)"},
                        }
                    ],
                    "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
                }
            )
        elif self.path.startswith("/orders"):
            self._send({"accepted": True, "order": request, "ticket": f"T{n:04d}"})
        else:
            self._send({"error": "no such path"}, 404)


class _ScriptedServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self._count = 0
        self._lock = threading.Lock()

    def tick(self) -> int:
        with self._lock:
            self._count += 1
            return self._count

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@contextmanager
def scripted_server() -> Iterator[str]:
    """A local server on a free port whose answers change on every call; stopped on exit."""
    server = _ScriptedServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.base
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def run_agent(api_base: str, model_base: str, prompt_suffix: str = "") -> dict[str, Any]:
    """The agent: clock, entropy, HTTP (httpx + requests), one model call, one audited decision."""
    started = time.time()
    today = datetime.datetime.now(datetime.UTC).isoformat()
    with httpx.Client(base_url=api_base, timeout=5) as http:
        quote = http.get("/quote").json()
        jitter = random.random()
        order_id = str(uuid.uuid4())
        qty = round(10 + jitter * 5, 3)
        placed = http.post("/orders", json={"order_id": order_id, "qty": qty, "price": quote["price"]}).json()
    status = requests.get(f"{api_base}/status", timeout=5).json()
    nonce = secrets.token_hex(8)
    salt = os.urandom(4).hex()
    pick = random.choice(["alpha", "beta", "gamma", "delta"])
    with openai.OpenAI(base_url=f"{model_base}/v1", api_key=API_KEY, max_retries=0) as llm:
        prompt = f"ACME at {quote['price']}, market {status['market']}. Buy?{prompt_suffix}"
        completion = llm.chat.completions.create(model="scripted-1", messages=[{"role": "user", "content": prompt}])
    answer = completion.choices[0].message.content or ""
    elapsed = time.monotonic()
    state = {"price": quote["price"], "market": status["market"], "answer": answer}
    with otel_replay.audit("trade", snapshot=DependencySnapshot(state, version="v1")) as decision:
        decision.read(quote=quote, status=status)
        if answer.startswith("BUY"):
            decision.act(
                Action("buy", {"order_id": order_id, "qty": qty, "ticket": placed["ticket"]}, cost=qty * quote["price"])
            )
    return {
        "started": started,
        "today": today,
        "quote": quote,
        "order_id": order_id,
        "qty": qty,
        "ticket": placed["ticket"],
        "status": status,
        "nonce": nonce,
        "salt": salt,
        "pick": pick,
        "answer": answer,
        "elapsed_positive": elapsed > 0,
    }


def agent_from_env() -> dict[str, Any]:
    """The agent as a no-argument entrypoint (for ``otel-replay rerun --entrypoint``): servers from the environment."""
    return run_agent(
        os.environ["RERUN_EXAMPLE_API"], os.environ["RERUN_EXAMPLE_MODEL"], os.environ.get("RERUN_EXAMPLE_SUFFIX", "")
    )


async def run_agent_async(api_base: str, model_base: str) -> dict[str, Any]:
    """The same agent on asyncio: two concurrent GETs, a POST and an async model call."""
    async with httpx.AsyncClient(base_url=api_base, timeout=5) as http:
        first, second = await asyncio.gather(http.get("/quote"), http.get("/status"))
        order_id = str(uuid.uuid4())
        placed = await http.post("/orders", json={"order_id": order_id, "at": time.time()})
    async with openai.AsyncOpenAI(base_url=f"{model_base}/v1", api_key=API_KEY, max_retries=0) as llm:
        completion = await llm.chat.completions.create(
            model="scripted-1", messages=[{"role": "user", "content": f"quote {first.json()['price']}"}]
        )
    return {
        "quote": first.json(),
        "status": second.json(),
        "ticket": placed.json()["ticket"],
        "order_id": order_id,
        "answer": completion.choices[0].message.content,
        "draw": random.random(),
    }


def main(dataset: str) -> int:
    """Record, stop the servers, rerun, change the prompt, rerun again; print what happened."""
    telemetry = otel_replay.configure(dataset, service_name="rerun-example", set_global=False)
    try:
        with scripted_server() as api, scripted_server() as model:
            with recording("example-session") as mode:
                original = run_agent(api, model)
            assert mode is not None
            telemetry.force_flush()
        print(f"recorded {mode.events} calls; original fingerprint {mode.fingerprint.hexdigest()[:16]}…")
        # Both servers are stopped now: the rerun is served from the dataset alone.
        result = rerun(lambda: run_agent(api, model), dataset=dataset, session_id="example-session")
        print(f"rerun: {result.summary()}; fingerprints equal: {result.fingerprint == result.original_fingerprint}")
        print(f"outputs identical: {result.output == original}")
        changed = rerun(lambda: run_agent(api, model, " Think twice."), dataset=dataset, session_id="example-session")
        print(f"changed prompt: {changed.summary()}")
        print(str(changed.divergence))
        telemetry.force_flush()
        return 0 if result.matched and result.output == original and not changed.matched else 1
    finally:
        telemetry.shutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="otel-replay-rerun-")))
