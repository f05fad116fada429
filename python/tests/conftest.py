"""Shared helpers for the package's tests: the repository's paths and the `dagloop` binary."""

from __future__ import annotations

import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def dagloop_binary() -> pathlib.Path:
    """The binary `cargo build` made (CARGO_TARGET_DIR, as scripts/test sets it)."""
    target = os.environ.get("CARGO_TARGET_DIR") or str(pathlib.Path.home() / ".cache/dagloop/target")
    return pathlib.Path(target) / "debug" / "dagloop"


@pytest.fixture
def root() -> pathlib.Path:
    return ROOT


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Runs `async def` tests on a fresh event loop (no plugin needed)."""
    import asyncio
    import inspect

    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    args = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    asyncio.run(pyfuncitem.obj(**args))
    return True


class Loopback:
    """An OpenAI-compatible chat endpoint on 127.0.0.1: each request is answered with the next
    canned Solution (as JSON text), streamed in `chunk`-character content deltas; every request
    body is kept in `requests`."""

    def __init__(self, answers: list[str], chunk: int = 8) -> None:
        import http.server
        import json
        import threading

        self.answers = list(answers)
        self.requests: list[dict[str, object]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                text = outer.answers.pop(0) if outer.answers else '{"calls": [], "output": null}'

                def frame(delta: dict[str, object], finish: str | None = None) -> bytes:
                    c = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                         "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
                    return f"data: {json.dumps(c)}\n\n".encode()

                frames = [frame({"role": "assistant", "content": ""})]
                frames += [frame({"content": text[i:i + chunk]}) for i in range(0, len(text), chunk)]
                frames += [frame({}, "stop"), b"data: [DONE]\n\n"]
                out = b"".join(frames)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def loopback(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """`loopback(answers)` starts a `Loopback` the `openai:` provider of this process talks to."""
    made: list[Loopback] = []

    def start(answers: list[str], chunk: int = 8) -> Loopback:
        lb = Loopback(answers, chunk)
        made.append(lb)
        monkeypatch.setenv("OPENAI_BASE_URL", lb.url)
        monkeypatch.setenv("OPENAI_API_KEY", "dummy")
        return lb

    yield start
    for lb in made:
        lb.close()
