"""Agents and runs from Python: a goal composed from Python objects (or read from a goal file),
started through the same library front-end as `dagloop run`, with this process answering the
calls of its Python tools, its reviewer callback answering approval requests, and its events
delivered as typed objects.

Deliberately not here: any rule of a run (what runs when, approval, re-asking on an invalid
output, the store's records): the native module drives the library, which decides."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import socket
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Generic, Iterable, Literal, Union

import pydantic
import pydantic_core
from typing_extensions import TypeVar

from . import _dagloop as _native
from ._bridge import DagloopError, native
from ._events import ApprovalRequested, Event, parse_event
from ._tools import Tool

# Python 3.12 starts a task eagerly on request (its first step at once, no turn of the loop).
_EAGER = sys.version_info >= (3, 12)

# The output type; Any for an agent given none.
T = TypeVar("T", default=Any)


class ScriptedModel:
    """The scripted model (DESIGN.md section 4): each request is answered with the next turn, as
    a script file's `turns` (`{"solution": {"calls": [...], "output": ...}}`, `{"text": ...}`,
    `{"error": {"status": 503}}`). Runs offline; every test of this package uses it."""

    def __init__(self, turns: Iterable[dict[str, Any]] | None = None, *, path: str | os.PathLike[str] | None = None) -> None:
        if (turns is None) == (path is None):
            raise ValueError("give the turns or a script file's path")
        self.turns = list(turns) if turns is not None else None
        self._path = os.path.abspath(path) if path is not None else None

    @staticmethod
    def solution(calls: Iterable[dict[str, Any]] = (), output: Any = None, thoughts: str | None = None, **turn: Any) -> dict[str, Any]:
        """One turn answering a Solution: these calls, then (when not None) this output."""
        sol: dict[str, Any] = {"calls": list(calls), "output": output}
        if thoughts is not None:
            sol["thoughts"] = thoughts
        return {"solution": sol, **turn}

    def spec(self) -> str:
        """The model spec the run is started with (`scripted:PATH`; the turns written once)."""
        if self._path is None:
            fd, path = tempfile.mkstemp(prefix="dagloop-script-", suffix=".json")
            with os.fdopen(fd, "w") as f:
                json.dump({"turns": self.turns}, f)
            self._path = path
        return f"scripted:{self._path}"


def call(tool: str | Tool, /, output_path: str | None = None, **params: Any) -> dict[str, Any]:
    """A call as a Solution writes it (for scripted turns): `call("add", a=1, output_path="†state.x")`."""
    c: dict[str, Any] = {"_tool": tool.name if isinstance(tool, Tool) else tool, **params}
    if output_path is not None:
        c["_outputPath"] = output_path
    return c


@dataclass(frozen=True)
class Decision:
    """A reviewer's answer (the HTTP API's decision object): `approve()`, `edit(params)`,
    `reject(reason)`, `send_back(feedback)`."""

    body: dict[str, Any]


def approve() -> Decision:
    return Decision({"decision": "approve"})


def edit(params: dict[str, Any]) -> Decision:
    """Run the call with these params instead (references in them are resolved again)."""
    return Decision({"decision": "edit", "params": params})


def reject(reason: str) -> Decision:
    """Do not run the call; the model is told why."""
    return Decision({"decision": "reject", "reason": reason})


def send_back(feedback: str) -> Decision:
    """Do not run the call, and tell the model what to do differently: not a veto, the model
    reads the feedback in its next request and may propose another call."""
    return Decision({"decision": "send_back", "feedback": feedback})


@dataclass(frozen=True)
class ApprovalRequest:
    """What a reviewer callback is shown: the tool, its params resolved (`read_from`: the calls
    they were resolved from), what the call would do (`action`: the HTTP request, the command,
    `{"kind": "other", "activity": "rust"}` for a Python tool...; None for a tool the goal does
    not define), the rule that asked, and the event itself."""

    call_id: int
    tool: str
    params: dict[str, Any]
    action: dict[str, Any] | None
    rule: str | None
    read_from: list[int]
    interrupted: bool
    event: ApprovalRequested


Reviewer = Callable[[ApprovalRequest], Union[Decision, Awaitable[Decision]]]


@dataclass(frozen=True)
class RunResult:
    """How a run ended (the `RunResult` of the HTTP API): `status` is `succeeded` or why not."""

    run_id: str
    status: str
    output: Any
    state: Any
    steps: int
    usage: dict[str, Any]
    calls: list[dict[str, Any]]
    error: dict[str, Any] | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"


@dataclass(frozen=True)
class Replay:
    """A stored run replayed: `identical`, or `divergence` says where it first differs."""

    identical: bool
    entries: int
    events: int
    events_digest: str
    status: str | None
    divergence: dict[str, Any] | None


class RunFailed(Exception):
    """The run ended without a valid output; `result` says how."""

    def __init__(self, result: RunResult) -> None:
        err = result.error or {}
        super().__init__(f"run {result.run_id} ended {result.status}: {err.get('message', '')}".rstrip(": "))
        self.result = result


def _result(run_id: str, text: str) -> RunResult:
    doc = json.loads(text)
    return RunResult(
        run_id=run_id,
        status=doc.get("status", ""),
        output=doc.get("output"),
        state=doc.get("state"),
        steps=doc.get("steps", 0),
        usage=doc.get("usage", {}),
        calls=doc.get("calls", []),
        error=doc.get("error"),
        raw=doc,
    )


Carry = Literal["state", "history", "both"]
"""What a follow-up run takes over from the run it continues."""


class Agent(Generic[T]):
    """An agent: a model, Python tools, an output type, and how its runs are reviewed and
    stored. `await agent.run(goal, input=...)` gives the output as an instance of
    `output_type`; `agent.stream(...)` gives the run's events as they happen."""

    def __init__(
        self,
        model: str | ScriptedModel | None = None,
        tools: Iterable[Tool] = (),
        output_type: type[T] | None = None,
        *,
        instructions: str | None = None,
        approval: str | None = None,
        on_approval: Reviewer | None = None,
        store: str | os.PathLike[str] | None = None,
        tools_from: str | os.PathLike[str] | None = None,
        tools_from_passthrough: bool = False,
        limits: dict[str, Any] | None = None,
        mode: str | None = None,
        goal_path: str | os.PathLike[str] | None = None,
    ) -> None:
        self.model = model
        self.tools = {t.name: t for t in tools}
        for t in tools:
            if not isinstance(t, Tool):
                raise TypeError(f"{t!r} is not a tool: decorate it with @dagloop.tool")
        self.output_type = output_type
        self._adapter = pydantic.TypeAdapter(output_type) if output_type is not None else None
        self.instructions = instructions
        self.approval = approval
        self.on_approval = on_approval
        self.store = os.fspath(store) if store is not None else None
        self.tools_from = tools_from
        self.tools_from_passthrough = tools_from_passthrough
        self.limits = limits
        self.mode = mode
        self.goal_path = os.path.abspath(goal_path) if goal_path is not None else None

    @classmethod
    def from_goal(cls, path: str | os.PathLike[str], *, tools: Iterable[Tool] = (), output_type: type[T] | None = None, **options: Any) -> "Agent[T]":
        """The agent a goal file describes; `tools` are Python functions for its
        `"_activity": "rust"` tools (or tools added to it)."""
        return cls(tools=tools, output_type=output_type, goal_path=path, **options)

    def output_schema(self) -> dict[str, Any] | None:
        """The output schema the run is given: the output type's JSON Schema (Pydantic's)."""
        return self._adapter.json_schema() if self._adapter is not None else None

    def _spec(self, goal: str | None, input: Any, resume: str | None = None, continue_from: str | None = None, carry: Carry = "both") -> dict[str, Any]:
        spec: dict[str, Any] = {"tools": [t.definition() for t in self.tools.values()], "reviewer": self.on_approval is not None}
        if isinstance(self.model, ScriptedModel):
            spec["model"] = self.model.spec()
        elif self.model is not None:
            spec["model"] = self.model
        if resume is not None:
            spec["resume"] = resume
        elif continue_from is not None:
            if self.store is None:
                raise ValueError("continuing a run needs the agent's store")
            text = goal if goal is not None else self.instructions
            if not text:
                raise ValueError("a follow-up needs its instruction: agent.run('now do this', continue_from=run_id)")
            spec["continue"] = {"run_id": continue_from, "text": text, "carry": carry}
        elif self.goal_path is not None:
            spec["goal_path"] = self.goal_path
            if input is not None:
                spec["input"] = _jsonable(input)
        else:
            text = goal if goal is not None else self.instructions
            if not text:
                raise ValueError("a run needs a goal: agent.run('what to do')")
            doc: dict[str, Any] = {"goal": text}
            if input is not None:
                doc["input"] = _jsonable(input)
            # Without an output type, any JSON value is an output.
            doc["output_schema"] = self.output_schema() or {}
            if self.limits:
                doc["limits"] = self.limits
            if self.mode:
                doc["mode"] = self.mode
            spec["goal"] = doc
        if self.approval is not None:
            spec["approve"] = self.approval
        if self.store is not None:
            spec["store"] = self.store
        if self.tools_from is not None:
            spec["tools_from"] = os.fspath(self.tools_from)
            spec["passthrough"] = self.tools_from_passthrough
        return spec

    def stream(self, goal: str | None = None, *, input: Any = None, continue_from: str | None = None, carry: Carry = "both") -> "RunStream[T]":
        """The run's events as they happen: `async for event in agent.stream(...)`; decide
        with `run.decide(...)` while iterating; `run.output` once it is over.
        `continue_from=run_id` follows up that finished stored run (see `run`)."""
        spec = self._spec(goal, input, continue_from=continue_from, carry=carry)
        spec["reviewer"] = True  # whoever iterates decides (`run.decide`)
        return RunStream(self, spec)

    def resume(self, run_id: str) -> "RunStream[T]":
        """Continues a stored run (this agent's `store`), as `dagloop resume` does: iterate it,
        or `await run.wait()`."""
        if self.store is None:
            raise ValueError("resuming needs the agent's store")
        spec = self._spec(None, None, resume=run_id)
        spec["reviewer"] = True
        return RunStream(self, spec)

    def fork(self, run_id: str, at_step: int, *, input: Any = None) -> "RunStream[T]":
        """A new run from stored run `run_id`'s state, plan and context after step `at_step`
        (as `dagloop fork`; the agent's model, when given, and `input` replace the original's),
        recorded in the agent's store and continued here."""
        if self.store is None:
            raise ValueError("forking needs the agent's store")
        spec = self._spec(None, None, resume="")
        del spec["resume"]
        spec["fork"] = {"run_id": run_id, "at_step": at_step}
        if input is not None:
            spec["input"] = _jsonable(input)
        spec["reviewer"] = True
        return RunStream(self, spec)

    async def replay(self, run_id: str) -> "Replay":
        """Stored run `run_id`'s journal through fresh machines, offline (`dagloop replay`):
        `identical`, or the first divergence."""
        store = self.store
        if store is None:
            raise ValueError("replaying needs the agent's store")
        doc = json.loads(await native(lambda done: _native.replay(store, run_id, done)))
        return Replay(
            identical=doc.get("divergence") is None,
            entries=doc["entries"],
            events=doc["events"],
            events_digest=doc["events_digest"],
            status=doc.get("status"),
            divergence=doc.get("divergence"),
        )

    async def run(self, goal: str | None = None, *, input: Any = None, continue_from: str | None = None, carry: Carry = "both") -> T:
        """Runs to the end; the output as an instance of `output_type` (`RunFailed` when the
        run ends without one). With `continue_from=run_id` (a finished run in the agent's
        store) the run is that run's follow-up in its session, as `dagloop run --continue`:
        `goal` is the new instruction, and `carry` says what it takes over (`"state"`, the
        session's `"history"`, or `"both"`); its id is the new run's `run_id`."""
        spec = self._spec(goal, input, continue_from=continue_from, carry=carry)
        return await RunStream(self, spec, want_events=False).output()

    def run_sync(self, goal: str | None = None, *, input: Any = None, continue_from: str | None = None, carry: Carry = "both") -> T:
        """`run` for code without an event loop."""
        return asyncio.run(self.run(goal, input=input, continue_from=continue_from, carry=carry))

    def _output(self, result: RunResult) -> T:
        if not result.succeeded:
            raise RunFailed(result)
        if self._adapter is None:
            return result.output  # type: ignore[no-any-return]
        return self._adapter.validate_python(result.output)


def _jsonable(v: Any) -> Any:
    """An input as JSON values (a Pydantic model, a dataclass, dates... as Pydantic dumps them)."""
    return pydantic_core.to_jsonable_python(v)


class RunStream(Generic[T]):
    """One run: iterate it for its events (`async for ev in run`), decide its calls, wait for
    its result. Started on first use."""

    def __init__(self, agent: Agent[T], spec: dict[str, Any], want_events: bool = True) -> None:
        self._agent = agent
        self._spec = spec
        self._want_events = want_events
        self._run: Any = None
        self._finished: RunResult | None = None
        self._started: asyncio.Future[None] | None = None
        self._queue: asyncio.Queue[Event | None] = asyncio.Queue()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._wake: socket.socket | None = None
        self._waker: asyncio.Task[None] | None = None
        # Results of calls not yet handed back: they go in one batch per turn of the event loop.
        self._answers: list[tuple[Any, ...]] = []
        # The answers of the take of calls going on (`_take_work`), None between takes.
        self._batch: list[tuple[Any, ...]] | None = None
        # The calls of Python tools still running: cancelled when the run is over.
        self._calls: set[asyncio.Task[Any]] = set()
        self._listener: asyncio.Task[None] | None = None
        self._presented: dict[int, ApprovalRequested] = {}
        self.result: RunResult | None = None

    @property
    def run_id(self) -> str | None:
        if self._run is not None:
            return str(self._run.run_id)
        return self._finished.run_id if self._finished else self._spec.get("resume")

    async def start(self) -> "RunStream[T]":
        """Starts the run (iterating or waiting does it too)."""
        if self._started is None:
            self._started = asyncio.get_running_loop().create_future()
            try:
                spec = json.dumps(self._spec)
                started = await native(lambda done: _native.start(spec, done))
            except DagloopError as e:
                if e.code == "agent.missing_activity":
                    e = DagloopError(e.code, e.message + " (from Python: pass a @dagloop.tool function of that name in tools=[...])")
                self._started.set_exception(e)
                self._started.exception()
                raise e from None
            except BaseException as e:
                self._started.set_exception(e)
                self._started.exception()
                raise
            if isinstance(started, str):
                self._finished = _result(self._spec.get("resume", ""), started)
                await self._queue.put(None)
            else:
                self._run = started
                self._watch_work()
                if self._want_events or self._agent.on_approval is not None:
                    self._listener = asyncio.ensure_future(self._listen())
            self._started.set_result(None)
        await self._started
        return self

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._events()

    async def _events(self) -> AsyncIterator[Event]:
        await self.start()
        while True:
            ev = await self._queue.get()
            if ev is None:
                return
            yield ev

    async def wait(self) -> RunResult:
        """The run's result once it is over."""
        await self.start()
        if self.result is not None:
            return self.result
        if self._finished is not None:
            self.result = self._finished
            return self.result
        try:
            text = await native(self._run.wait)
        except asyncio.CancelledError:
            # Whoever waited is gone (a cancelled task, Ctrl-C): the run is cancelled with it,
            # not left running with nobody to answer its Python tools.
            self._run.cancel(lambda _v, _e: None, "the Python task waiting for the run was cancelled")
            raise
        if self._listener is not None:
            await self._listener
        self._unwatch_work()
        self.result = _result(self._run.run_id, text)
        return self.result

    async def output(self) -> T:
        """The output as an instance of the agent's `output_type` (`RunFailed` otherwise)."""
        return self._agent._output(await self.wait())

    async def decide(self, call: int | ApprovalRequested, decision: Decision) -> None:
        """Answers an approval request (the event, or its call id: the latest presentation of
        that call is quoted). `DagloopError` when the run refuses it (a stale decision...)."""
        await self.start()
        ev = call if isinstance(call, ApprovalRequested) else self._presented.get(call)
        call_id = ev.call_id if ev is not None else call
        assert isinstance(call_id, int)
        body = json.dumps(decision.body)
        hash_, seq = (ev.params_hash, ev.seq) if ev is not None else (None, None)
        await native(self._run.decide, call_id, body, hash_, seq)

    async def cancel(self, reason: str = "cancelled from Python") -> None:
        await self.start()
        await native(self._run.cancel, reason)

    def _watch_work(self) -> None:
        """Calls of Python tools are taken when the run's wake-up socket is readable: all those
        queued by then at once, each started as a task. A loop that cannot watch a socket
        (`add_reader`: Windows' proactor loop) has a task await it (`sock_recv`) instead."""
        handle = self._run.wake_fd()
        if handle is None:
            return
        sock = socket.socket(fileno=handle)
        sock.setblocking(False)
        self._wake = sock
        loop = asyncio.get_running_loop()
        try:
            loop.add_reader(sock, self._take_work)
        except NotImplementedError:
            self._waker = asyncio.ensure_future(self._await_work(sock))

    async def _await_work(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while self._wake is sock and await loop.sock_recv(sock, 4096):
            self._take_work(read=True)

    def _unwatch_work(self) -> None:
        """The run is over: no call comes any more, and the calls still running are cancelled
        (`CancelledError` inside the function; nobody waits for their results)."""
        for task in list(self._calls):
            task.cancel()
        sock, self._wake = self._wake, None
        if sock is None:
            return
        if self._waker is not None:
            self._waker.cancel()
            self._waker = None
        else:
            asyncio.get_running_loop().remove_reader(sock)
        sock.close()

    def _take_work(self, read: bool = False) -> None:
        if self._wake is None:
            return
        if not read:
            try:
                self._wake.recv(4096)
            except (BlockingIOError, InterruptedError):
                pass
        # The results of the calls that answer during this take (eager tasks that never awaited)
        # go back together, in one call, as soon as every call taken has started.
        batch: list[tuple[Any, ...]] = []
        self._batch = batch
        loop = asyncio.get_running_loop()
        try:
            for name, params, reply in self._run.take_work():
                self._start_call(loop, name, params, reply, batch)
        finally:
            self._batch = None
        if batch:
            _native.answer(batch)

    def _start_call(
        self, loop: asyncio.AbstractEventLoop, name: str, params: str, reply: Any, batch: list[tuple[Any, ...]]
    ) -> None:
        """Starts one call: its params checked, then the function run in a task of its own. On
        Python >= 3.12 the task starts eagerly (`eager_start`): it runs up to its first await
        here, and a call that never awaits is over before this returns, with nothing scheduled
        (the task is the current task meanwhile, as `asyncio.timeout`, `TaskGroup` and anyio
        require). Before 3.12 the task runs from the next turn of the event loop."""
        tool = self._agent.tools.get(name)
        if tool is None:
            reply.fail("LookupError", f"no Python function for tool `{name}`")
            return
        try:
            kwargs = tool.arguments(params)
        except pydantic.ValidationError as e:
            reply.bad_params(name, str(e))
            return
        except Exception as e:  # noqa: BLE001 - a hint Pydantic cannot resolve...: the call's error
            reply.fail(type(e).__name__, str(e))
            return
        coro = self._call(tool, kwargs, reply, batch)
        if _EAGER:
            task = asyncio.Task(coro, loop=loop, eager_start=True)  # type: ignore[call-arg,unused-ignore]
            if task.done():
                return
        else:
            task = loop.create_task(coro)
        self._calls.add(task)  # `_call` takes it out as it ends (no done callback to schedule)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _call(self, tool: Tool, kwargs: dict[str, Any], reply: Any, batch: list[tuple[Any, ...]]) -> None:
        try:
            if tool.is_async and tool.timeout is None:  # `tool.run`, one coroutine fewer
                result = pydantic_core.to_json(await tool.fn(**kwargs))
            else:
                result = await tool.run(kwargs)
        except (asyncio.TimeoutError, TimeoutError):
            reply.timeout(float(tool.timeout or 0))
        except BaseException as e:  # noqa: BLE001 - every failure is the call's, never the run's
            self._hand_back(batch, (reply, type(e).__name__, str(e)))
            if not isinstance(e, Exception):
                raise
        else:
            self._hand_back(batch, (reply, result))
        finally:
            if self._calls:
                self._calls.discard(asyncio.current_task())  # type: ignore[arg-type,unused-ignore]

    def _hand_back(self, batch: list[tuple[Any, ...]], answer: tuple[Any, ...]) -> None:
        """Keeps a call's answer (`(reply, result_json)` or `(reply, exception, message)`) for
        the next batch: the take's, while the take that started the call is going on (the call
        never awaited), else the one handed back after this turn of the event loop."""
        if batch is self._batch:
            batch.append(answer)
            return
        if not self._answers:
            asyncio.get_running_loop().call_soon(self._answer)
        self._answers.append(answer)

    def _answer(self) -> None:
        """Hands back the results gathered since the last time, at once (`_native.answer`)."""
        answers, self._answers = self._answers, []
        _native.answer(answers)

    async def _listen(self) -> None:
        while True:
            text = await native(self._run.next_event)
            if text is None:
                break
            ev = parse_event(json.loads(text))
            if isinstance(ev, ApprovalRequested) and ev.call_id is not None:
                self._presented[ev.call_id] = ev
                if self._agent.on_approval is not None:
                    self._spawn(self._review(ev))
            if self._want_events:
                await self._queue.put(ev)
        self._unwatch_work()  # the run is over: no call comes any more
        await self._queue.put(None)

    async def _review(self, ev: ApprovalRequested) -> None:
        assert self._agent.on_approval is not None and ev.call_id is not None
        action = self._run.action(ev.tool, json.dumps(ev.params))
        req = ApprovalRequest(
            ev.call_id, ev.tool, ev.params, json.loads(action) if action else None, ev.rule, ev.read_from, ev.interrupted, ev
        )
        try:
            d = self._agent.on_approval(req)
            if inspect.isawaitable(d):
                d = await d
            if not isinstance(d, Decision):
                d = reject(f"the reviewer callback returned {d!r}, not approve()/edit()/reject()/send_back()")
        except Exception as e:  # noqa: BLE001
            d = reject(f"the reviewer callback raised {type(e).__name__}: {e}")
        try:
            await self.decide(ev, d)
        except DagloopError:
            pass  # decided otherwise meanwhile (the run says so in a decision_dropped event)
