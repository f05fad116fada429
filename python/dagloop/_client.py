"""A client for `dagloop serve` (its API: schemas/openapi.json): submit a goal, wait for the
result, follow the events as typed objects, decide calls, cancel. Standard library only, two
faces over one description of the API (`OPERATIONS`, the bodies, `_Sse` for the event stream):
`Client` is synchronous (urllib); `AsyncClient` is natively async (HTTP/1.1 over asyncio
streams, one connection per request, no thread).

Deliberately not here: anything the server decides (it checks goals, grants and decisions and
answers with coded errors, raised here as `DagloopError`)."""

from __future__ import annotations

import asyncio
import json
import os
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
        method, path, data = _prepare(op, params, body, query)
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=_headers(self.token, data))
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                text = resp.read().decode()
                return resp.status, json.loads(text) if text else None
        except urllib.error.HTTPError as e:
            raise _api_error(e.code, e.reason, e.read()) from None

    def submit(self, goal: dict[str, Any] | str | os.PathLike[str], *, model: str | None = None, approve: str | None = None, mode: str | None = None, input: Any = None, wait: float | None = None) -> RunOutcome:
        """Submits a goal document (a dict, or a goal file's path read here). With `wait`
        (seconds), the answer waits for the run to end or to need a decision."""
        _, out = self._request("create_run", {}, _submission(goal, model, approve, mode, input), {"wait": wait})
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
        method, path, _ = _prepare("events", {"id": run_id}, query={"after": after})
        req = urllib.request.Request(self.url + path, method=method, headers=_headers(self.token, None, "text/event-stream"))
        try:
            resp = urllib.request.urlopen(req, timeout=self.timeout)
        except urllib.error.HTTPError as e:
            raise _api_error(e.code, e.reason, e.read()) from None
        with resp:
            sse = _Sse()
            for raw in resp:
                ev = sse.line(raw)
                if ev is not None:
                    yield ev

    def decide(self, run_id: str, call: int | ApprovalRequested, decision: Decision) -> str:
        """Decides a call awaiting approval; given the `approval_requested` event, the decision
        quotes what it answers (`presented`, `presentation`). Returns `applied` or `recorded`."""
        call_id, body = _decision(call, decision)
        _, out = self._request("decide", {"id": run_id, "call": call_id}, body)
        return str(out["status"])

    def cancel(self, run_id: str, reason: str = "cancelled from Python") -> str:
        _, out = self._request("cancel", {"id": run_id}, {"reason": reason})
        return str(out["status"])


def _prepare(op: str, params: dict[str, Any], body: Any = None, query: dict[str, Any] | None = None) -> tuple[str, str, bytes | None]:
    """The operation's method, path (with its query) and JSON body (every POST has one)."""
    method, template = OPERATIONS[op]
    path = template.format(**{k: urllib.parse.quote(str(v), safe="") for k, v in params.items()})
    if query:
        path += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
    data = None
    if body is not None or method == "POST":
        data = json.dumps(body if body is not None else {}).encode()
    return method, path, data


def _headers(token: str | None, data: bytes | None, accept: str = "application/json") -> dict[str, str]:
    headers = {"Accept": accept}
    if data is not None:
        headers["Content-Type"] = "application/json"
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def _submission(goal: dict[str, Any] | str | os.PathLike[str], model: str | None, approve: str | None, mode: str | None, input: Any) -> dict[str, Any]:
    """The body of `create_run`: a goal document (a dict, or a goal file's path read here)."""
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
    return body


def _decision(call: int | ApprovalRequested, decision: Decision) -> tuple[int, dict[str, Any]]:
    """The call decided and the body of `decide`; given the `approval_requested` event, the body
    quotes what it answers (`presented`, `presentation`)."""
    body = dict(decision.body)
    if isinstance(call, ApprovalRequested):
        body["presented"] = call.params_hash
        body["presentation"] = call.seq
        assert call.call_id is not None
        return call.call_id, body
    return call, body


class _Sse:
    """Server-Sent Events read a line at a time: `line` returns the typed event a blank line
    completes (None otherwise, and for comments and data that is not an event)."""

    def __init__(self) -> None:
        self.data: list[str] = []

    def line(self, raw: bytes) -> Event | None:
        line = raw.decode().rstrip("\r\n")
        if line == "":
            if not self.data:
                return None
            doc = json.loads("\n".join(self.data))
            self.data = []
            return parse_event(doc) if isinstance(doc, dict) and "type" in doc else None
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if name == "data":
            self.data.append(value[1:] if value.startswith(" ") else value)
        return None


def _api_error(status: int, reason: str, body: bytes) -> DagloopError:
    try:
        doc = json.loads(body.decode())
        return DagloopError(doc["code"], doc["message"])
    except Exception:  # noqa: BLE001 - not an ApiError body: say what came back
        return DagloopError("http.status", f"HTTP {status} {reason}")


class AsyncClient:
    """`Client` for async code: the same operations as coroutines, and `events` as an async
    iterator of typed events. Natively async: each request is HTTP/1.1 on its own connection
    over asyncio streams (`https` URLs through `ssl`), so many runs are followed at once on one
    event loop with no thread; `timeout` bounds each request, and each wait for the stream's
    next line."""

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 330.0) -> None:
        self.url = url.rstrip("/")
        self.token = token if token is not None else os.environ.get("DAGLOOP_TOKEN")
        self.timeout = timeout
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self._tls = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._tls else 80)
        self._base = parts.path.rstrip("/")
        self._authority = parts.netloc.rpartition("@")[2]

    async def _open(self, op: str, params: dict[str, Any], body: Any = None, query: dict[str, Any] | None = None, accept: str = "application/json") -> "_Response":
        """Sends the request; returns the response once its head is read (its body unread)."""
        method, path, data = _prepare(op, params, body, query)
        headers = _headers(self.token, data, accept)
        headers["Host"] = self._authority
        headers["Connection"] = "close"
        if data is not None:
            headers["Content-Length"] = str(len(data))
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(self._host, self._port, ssl=self._tls or None), self.timeout
        )
        try:
            head = f"{method} {self._base + path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            writer.write(head.encode("latin-1") + b"\r\n" + (data or b""))
            await writer.drain()
            status_line = await asyncio.wait_for(reader.readline(), self.timeout)
            version, _, rest = status_line.decode("latin-1").strip().partition(" ")
            code, _, reason = rest.partition(" ")
            if not version.startswith("HTTP/") or not code.isdigit():
                raise DagloopError("http.status", f"not an HTTP response: {status_line[:80]!r}")
            fields: dict[str, str] = {}
            while True:
                line = await asyncio.wait_for(reader.readline(), self.timeout)
                if line in (b"\r\n", b"\n", b""):
                    break
                name, _, value = line.decode("latin-1").partition(":")
                fields[name.strip().lower()] = value.strip()
        except BaseException:
            writer.close()
            raise
        return _Response(int(code), reason, fields, reader, writer)

    async def _request(self, op: str, params: dict[str, Any], body: Any = None, query: dict[str, Any] | None = None) -> Any:
        async def exchange() -> Any:
            resp = await self._open(op, params, body, query)
            try:
                data = await resp.read()
            finally:
                resp.close()
            if resp.status >= 400:
                raise _api_error(resp.status, resp.reason, data)
            return json.loads(data) if data else None

        return await asyncio.wait_for(exchange(), self.timeout)

    async def submit(self, goal: dict[str, Any] | str | os.PathLike[str], *, model: str | None = None, approve: str | None = None, mode: str | None = None, input: Any = None, wait: float | None = None) -> RunOutcome:
        """Submits a goal document (a dict, or a goal file's path read here). With `wait`
        (seconds), the answer waits for the run to end or to need a decision."""
        out = await self._request("create_run", {}, _submission(goal, model, approve, mode, input), {"wait": wait})
        return RunOutcome.of(out)

    async def result(self, run_id: str, *, wait: float = 0) -> RunOutcome:
        """The run's result now, or once it ends within `wait` seconds (0 to 300)."""
        return RunOutcome.of(await self._request("result", {"id": run_id}, query={"wait": wait}))

    async def wait(self, run_id: str, *, poll: float = 30) -> RunOutcome:
        """The run's result once it has ended (however long that takes)."""
        while True:
            out = await self.result(run_id, wait=poll)
            if out.finished:
                return out

    async def run(self, run_id: str) -> dict[str, Any]:
        """The run described (`RunView`): calls, timeline, awaiting calls, state, output."""
        return await self._request("get_run", {"id": run_id})  # type: ignore[no-any-return]

    async def decide(self, run_id: str, call: int | ApprovalRequested, decision: Decision) -> str:
        """Decides a call awaiting approval (see `Client.decide`). Returns `applied` or `recorded`."""
        call_id, body = _decision(call, decision)
        out = await self._request("decide", {"id": run_id, "call": call_id}, body)
        return str(out["status"])

    async def cancel(self, run_id: str, reason: str = "cancelled from Python") -> str:
        out = await self._request("cancel", {"id": run_id}, {"reason": reason})
        return str(out["status"])

    async def events(self, run_id: str, *, after: int = 0) -> AsyncIterator[Event]:
        """The run's events from the start (or after `after`), then live ones, until it ends."""
        resp = await self._open("events", {"id": run_id}, query={"after": after}, accept="text/event-stream")
        try:
            if resp.status >= 400:
                raise _api_error(resp.status, resp.reason, await asyncio.wait_for(resp.read(), self.timeout))
            sse = _Sse()
            async for raw in resp.lines(self.timeout):
                ev = sse.line(raw)
                if ev is not None:
                    yield ev
        finally:
            resp.close()


class _Response:
    """A response whose head was read: its body is read whole (`read`) or a line at a time
    (`lines`), through chunked transfer coding, a `Content-Length`, or up to the end."""

    def __init__(self, status: int, reason: str, headers: dict[str, str], reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        self._reader = reader
        self._writer = writer

    async def _pieces(self) -> AsyncIterator[bytes]:
        r = self._reader
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            while True:
                size = int((await r.readline()).split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    return
                yield await r.readexactly(size)
                await r.readexactly(2)  # the chunk's CRLF
        elif "content-length" in self.headers:
            yield await r.readexactly(int(self.headers["content-length"]))
        else:
            while piece := await r.read(65536):
                yield piece

    async def read(self) -> bytes:
        return b"".join([p async for p in self._pieces()])

    async def lines(self, timeout: float) -> AsyncIterator[bytes]:
        """The body's lines (each with its end), each awaited for at most `timeout` seconds."""
        pieces = self._pieces().__aiter__()
        buf = b""
        while True:
            try:
                piece = await asyncio.wait_for(pieces.__anext__(), timeout)
            except StopAsyncIteration:
                if buf:
                    yield buf
                return
            buf += piece
            *whole, buf = buf.split(b"\n")
            for line in whole:
                yield line + b"\n"

    def close(self) -> None:
        self._writer.close()
