"""A client for `dagloop serve` (its API: schemas/openapi.json): submit a goal, wait for the
result, follow the events as typed objects, decide calls, cancel. Standard library only
(urllib; the event stream is read as Server-Sent Events); synchronous — from async code, call
it through `asyncio.to_thread`.

Deliberately not here: anything the server decides (it checks goals, grants and decisions and
answers with coded errors, raised here as `DagloopError`)."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Iterator

from ._agent import Decision
from ._bridge import DagloopError
from ._events import ApprovalRequested, Event, parse_event

# The operations this client uses, as (method, path) of schemas/openapi.json (checked by
# python/tests/test_client.py against the document).
OPERATIONS = {
    "create_run": ("POST", "/runs"),
    "result": ("GET", "/runs/{id}/result"),
    "events": ("GET", "/runs/{id}/events"),
    "decide": ("POST", "/runs/{id}/approvals/{call}"),
    "cancel": ("POST", "/runs/{id}/cancel"),
    "get_run": ("GET", "/runs/{id}"),
}


@dataclass(frozen=True)
class RunOutcome:
    """Where a remote run stands (`RunOutcome`): once `finished`, `output` and `error` are final."""

    id: str
    status: str
    finished: bool
    output: Any = None
    error: dict[str, Any] | None = None
    awaiting: list[dict[str, Any]] | None = None
    usage: dict[str, Any] | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, doc: dict[str, Any]) -> "RunOutcome":
        return cls(
            id=doc["id"],
            status=doc["status"],
            finished=doc["finished"],
            output=doc.get("output"),
            error=doc.get("error"),
            awaiting=doc.get("awaiting"),
            usage=doc.get("usage"),
            raw=doc,
        )


class Client:
    """`dagloop serve` at `url`, with a bearer `token` (default: `DAGLOOP_TOKEN`, else none)."""

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 330.0) -> None:
        self.url = url.rstrip("/")
        self.token = token if token is not None else os.environ.get("DAGLOOP_TOKEN")
        self.timeout = timeout

    def _request(self, op: str, params: dict[str, Any], body: Any = None, query: dict[str, Any] | None = None) -> tuple[int, Any]:
        method, template = OPERATIONS[op]
        path = template.format(**{k: urllib.parse.quote(str(v), safe="") for k, v in params.items()})
        if query:
            path += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        headers = {"Accept": "application/json"}
        data = None
        if body is not None or method == "POST":
            data = json.dumps(body if body is not None else {}).encode()
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                text = resp.read().decode()
                return resp.status, json.loads(text) if text else None
        except urllib.error.HTTPError as e:
            raise _api_error(e) from None

    def submit(self, goal: dict[str, Any] | str | os.PathLike[str], *, model: str | None = None, approve: str | None = None, mode: str | None = None, input: Any = None, wait: float | None = None) -> RunOutcome:
        """Submits a goal document (a dict, or a goal file's path read here). With `wait`
        (seconds), the answer waits for the run to end or to need a decision."""
        if isinstance(goal, dict):
            doc = dict(goal)
        else:
            with open(goal) as f:
                doc = json.load(f)
        if input is not None:
            doc["input"] = input
        body: dict[str, Any] = {"goal": doc}
        for k, v in (("model", model), ("approve", approve), ("mode", mode)):
            if v is not None:
                body[k] = v
        _, out = self._request("create_run", {}, body, {"wait": wait})
        return RunOutcome.of(out)

    def result(self, run_id: str, *, wait: float = 0) -> RunOutcome:
        """The run's result now, or once it ends within `wait` seconds (0 to 300)."""
        _, out = self._request("result", {"id": run_id}, query={"wait": wait})
        return RunOutcome.of(out)

    def wait(self, run_id: str, *, poll: float = 30) -> RunOutcome:
        """The run's result once it has ended (however long that takes)."""
        while True:
            out = self.result(run_id, wait=poll)
            if out.finished:
                return out

    def run(self, run_id: str) -> dict[str, Any]:
        """The run described (`RunView`): calls, timeline, awaiting calls, state, output."""
        return self._request("get_run", {"id": run_id})[1]  # type: ignore[no-any-return]

    def events(self, run_id: str, *, after: int = 0) -> Iterator[Event]:
        """The run's events from the start (or after `after`), then live ones, until it ends."""
        method, template = OPERATIONS["events"]
        url = self.url + template.format(id=urllib.parse.quote(run_id, safe="")) + f"?after={after}"
        headers = {"Accept": "text/event-stream"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(url, method=method, headers=headers)
        try:
            resp = urllib.request.urlopen(req, timeout=self.timeout)
        except urllib.error.HTTPError as e:
            raise _api_error(e) from None
        with resp:
            data: list[str] = []
            for raw in resp:
                line = raw.decode().rstrip("\r\n")
                if line == "":
                    if data:
                        doc = json.loads("\n".join(data))
                        data = []
                        if isinstance(doc, dict) and "type" in doc:
                            yield parse_event(doc)
                    continue
                if line.startswith(":"):
                    continue
                name, _, value = line.partition(":")
                if name == "data":
                    data.append(value[1:] if value.startswith(" ") else value)

    def decide(self, run_id: str, call: int | ApprovalRequested, decision: Decision) -> str:
        """Decides a call awaiting approval; given the `approval_requested` event, the decision
        quotes what it answers (`presented`, `presentation`). Returns `applied` or `recorded`."""
        body = dict(decision.body)
        if isinstance(call, ApprovalRequested):
            body["presented"] = call.params_hash
            body["presentation"] = call.seq
            call_id = call.call_id
        else:
            call_id = call
        _, out = self._request("decide", {"id": run_id, "call": call_id}, body)
        return str(out["status"])

    def cancel(self, run_id: str, reason: str = "cancelled from Python") -> str:
        _, out = self._request("cancel", {"id": run_id}, {"reason": reason})
        return str(out["status"])


def _api_error(e: urllib.error.HTTPError) -> DagloopError:
    try:
        doc = json.loads(e.read().decode())
        return DagloopError(doc["code"], doc["message"])
    except Exception:  # noqa: BLE001 - not an ApiError body: say what came back
        return DagloopError("http.status", f"HTTP {e.code} {e.reason}")


class AsyncClient:
    """`Client` for async code: the same operations as coroutines, and `events` as an async
    iterator of typed events. Each request runs in a worker thread (the standard library's
    HTTP client), so the event loop is never blocked; the stream is read in one thread while
    it lasts."""

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 330.0) -> None:
        self.sync = Client(url, token, timeout=timeout)

    async def submit(self, goal: dict[str, Any] | str | os.PathLike[str], *, model: str | None = None, approve: str | None = None, mode: str | None = None, input: Any = None, wait: float | None = None) -> RunOutcome:
        return await asyncio.to_thread(self.sync.submit, goal, model=model, approve=approve, mode=mode, input=input, wait=wait)

    async def result(self, run_id: str, *, wait: float = 0) -> RunOutcome:
        return await asyncio.to_thread(self.sync.result, run_id, wait=wait)

    async def wait(self, run_id: str, *, poll: float = 30) -> RunOutcome:
        return await asyncio.to_thread(self.sync.wait, run_id, poll=poll)

    async def run(self, run_id: str) -> dict[str, Any]:
        return await asyncio.to_thread(self.sync.run, run_id)

    async def decide(self, run_id: str, call: int | ApprovalRequested, decision: Decision) -> str:
        return await asyncio.to_thread(self.sync.decide, run_id, call, decision)

    async def cancel(self, run_id: str, reason: str = "cancelled from Python") -> str:
        return await asyncio.to_thread(self.sync.cancel, run_id, reason)

    async def events(self, run_id: str, *, after: int = 0) -> AsyncIterator[Event]:
        """The run's events from the start (or after `after`), then live ones, until it ends."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Event | BaseException | None] = asyncio.Queue()
        stop = threading.Event()

        def read() -> None:
            try:
                for ev in self.sync.events(run_id, after=after):
                    if stop.is_set():
                        return
                    loop.call_soon_threadsafe(queue.put_nowait, ev)
                loop.call_soon_threadsafe(queue.put_nowait, None)
            except BaseException as e:  # noqa: BLE001 - handed to the iterating task
                if not stop.is_set():
                    loop.call_soon_threadsafe(queue.put_nowait, e)

        reader = threading.Thread(target=read, name="dagloop-events", daemon=True)
        reader.start()
        try:
            while True:
                item = await queue.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
