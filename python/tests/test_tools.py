"""Python functions as tools: schemas from type hints, sync and async functions, calls that
answer at once beside calls that await, each call its own task, a fan-out that runs
concurrently, an exception (before or after an await, or from a validator) becoming the call's
error, a cancelled run cancelling its tools, params taken as parsed or through Pydantic."""

from __future__ import annotations

import asyncio
import datetime
import threading
import time
from typing import Any

import pytest

import dagloop
from dagloop import ScriptedModel, call


@dagloop.tool
async def nap(seconds: float, i: int) -> dict[str, Any]:
    """Sleeps, then says which call it was."""
    await asyncio.sleep(seconds)
    return {"i": i}


@dagloop.tool
def add(a: int, b: int = 1) -> int:
    """Adds two integers."""
    add.threads.add(threading.current_thread().name)  # type: ignore[attr-defined]
    return a + b


add.threads = set()  # type: ignore[attr-defined]


@dagloop.tool
async def shout(text: str) -> str:
    return text.upper()


@dagloop.tool(idempotent=True, approval="never", timeout=0.2)
async def fragile(kind: str) -> str:
    """Fails on purpose."""
    if kind == "slow":
        await asyncio.sleep(5)
    raise ValueError(f"cannot handle {kind}")


def test_definition_comes_from_the_signature_and_docstring() -> None:
    d = add.definition()
    assert d["_tool"] == "add" and d["_activity"] == "rust"
    assert d["description"] == "Adds two integers."
    assert d["properties"] == {"a": {"type": "integer"}, "b": {"default": 1, "type": "integer"}}
    assert d["required"] == ["a"]
    f = fragile.definition()
    assert f["_idempotent"] is True and f["_approval"] == "never"
    assert add(2, 3) == 5  # still the function


def test_a_fan_out_of_async_tools_runs_concurrently() -> None:
    n, sleep = 12, 0.4
    model = ScriptedModel([
        ScriptedModel.solution([call(nap, seconds=sleep, i=i, output_path=f"†state.r{i}") for i in range(n)]),
        ScriptedModel.solution(output={"done": True}),
    ])
    agent = dagloop.Agent(model=model, tools=[nap])
    started = time.monotonic()
    out = agent.run_sync("nap in parallel")
    wall = time.monotonic() - started
    assert out == {"done": True}
    assert wall < n * sleep / 3, f"{wall:.2f}s for {n} calls of {sleep}s: not concurrent"


class _NoWatchLoop(asyncio.SelectorEventLoop):
    """A loop that cannot watch a socket, as Windows' proactor loop: `add_reader` is refused."""

    def add_reader(self, fd: Any, callback: Any, *args: Any) -> None:  # type: ignore[override]
        raise NotImplementedError("this loop does not watch sockets")


def test_a_loop_that_cannot_watch_sockets_still_runs_the_calls() -> None:
    """The wake-up socket awaited through `loop.sock_recv` (the proactor loop's way), not watched."""
    n, sleep = 12, 0.4
    model = ScriptedModel([
        ScriptedModel.solution([call(nap, seconds=sleep, i=i, output_path=f"†state.r{i}") for i in range(n)]),
        ScriptedModel.solution(output={"done": True}),
    ])
    agent = dagloop.Agent(model=model, tools=[nap])
    loop = _NoWatchLoop()
    try:
        started = time.monotonic()
        out = loop.run_until_complete(agent.run("nap in parallel"))
        wall = time.monotonic() - started
    finally:
        loop.close()
    assert out == {"done": True}
    assert wall < n * sleep / 3, f"{wall:.2f}s for {n} calls of {sleep}s: not concurrent"


async def test_sync_and_async_tools_write_their_results() -> None:
    add.threads.clear()  # type: ignore[attr-defined]
    model = ScriptedModel([
        ScriptedModel.solution([
            call(add, a=2, b=3, output_path="†state.sum"),
            call(shout, text="hi", output_path="†state.loud"),
        ]),
        ScriptedModel.solution(output="ok"),
    ])
    run = dagloop.Agent(model=model, tools=[add, shout]).stream("add and shout")
    async for _ in run:
        pass
    result = await run.wait()
    assert result.status == "succeeded", result
    assert result.state["sum"] == 5 and result.state["loud"] == "HI"
    # The sync function ran in a worker thread, off the event loop.
    assert add.threads and threading.main_thread().name not in add.threads  # type: ignore[attr-defined]


async def test_an_exception_in_a_tool_is_the_calls_error() -> None:
    model = ScriptedModel([
        ScriptedModel.solution([
            call(fragile, kind="odd", output_path="†state.x || †state.err"),
            call(fragile, kind="slow", output_path="†state.y || †state.slow"),
            call(add, a="not a number", output_path="†state.z || †state.bad"),
        ]),
        ScriptedModel.solution(output="carried on"),
    ])
    run = dagloop.Agent(model=model, tools=[fragile, add]).stream("fail")
    events = [ev async for ev in run]
    failed = [ev for ev in events if isinstance(ev, dagloop.CallFailed)]
    refused = [ev for ev in events if isinstance(ev, dagloop.CallRefused)]
    result = await run.wait()
    assert result.status == "succeeded" and result.output == "carried on"
    assert result.state["err"]["code"] == "activity.failed"
    assert result.state["err"]["message"] == "ValueError: cannot handle odd"
    assert result.state["slow"]["code"] == "activity.timeout"
    assert len(failed) == 2 and {ev.error["code"] for ev in failed} == {"activity.failed", "activity.timeout"}
    # Params that do not fit the type hints are refused by the core, from the tool's schema.
    assert len(refused) == 1 and 'is not of type "integer"' in refused[0].reason


@dagloop.tool
async def early_or_late(when: str) -> str:
    """Raises before its first await (`early`) or after it (`late`)."""
    if when == "early":
        raise KeyError("before any await")
    await asyncio.sleep(0.01)
    raise RuntimeError("after an await")


async def test_calls_that_answer_at_once_and_calls_that_await_both_answer() -> None:
    """`shout` returns without awaiting (on Python >= 3.12 it is over while the calls are taken),
    `nap` sleeps first; both results are written. `seconds=0` is a JSON integer for a `float`."""
    model = ScriptedModel([
        ScriptedModel.solution([
            *(call(shout, text=f"t{i}", output_path=f"†state.loud{i}") for i in range(5)),
            *(call(nap, seconds=0.05 if i else 0, i=i, output_path=f"†state.nap{i}") for i in range(5)),
        ]),
        ScriptedModel.solution(output="ok"),
    ])
    result = await dagloop.Agent(model=model, tools=[shout, nap]).stream("both").wait()
    assert result.status == "succeeded", result
    assert [result.state[f"loud{i}"] for i in range(5)] == [f"T{i}" for i in range(5)]
    assert [result.state[f"nap{i}"] for i in range(5)] == [{"i": i} for i in range(5)]


async def test_an_exception_before_or_after_the_first_await_is_the_calls_error() -> None:
    model = ScriptedModel([
        ScriptedModel.solution([
            call(early_or_late, when="early", output_path="†state.x || †state.early"),
            call(early_or_late, when="late", output_path="†state.y || †state.late"),
        ]),
        ScriptedModel.solution(output="carried on"),
    ])
    result = await dagloop.Agent(model=model, tools=[early_or_late]).stream("fail").wait()
    assert result.status == "succeeded" and result.output == "carried on", result
    assert result.state["early"]["code"] == "activity.failed"
    assert result.state["early"]["message"] == "KeyError: 'before any await'"
    assert result.state["late"]["code"] == "activity.failed"
    assert result.state["late"]["message"] == "RuntimeError: after an await"


async def test_cancelling_a_run_cancels_the_tool_it_waits_for() -> None:
    """The run is cancelled while the tool awaits: `CancelledError` is raised inside the tool."""
    started, seen = asyncio.Event(), []

    @dagloop.tool
    async def wait_long(seconds: float) -> str:
        started.set()
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        return "done"

    model = ScriptedModel([ScriptedModel.solution([call(wait_long, seconds=30, output_path="†state.x")])])
    run = dagloop.Agent(model=model, tools=[wait_long], approval="auto").stream("wait")
    await run.start()
    await asyncio.wait_for(started.wait(), 10)
    await run.cancel("enough")
    result = await asyncio.wait_for(run.wait(), 10)
    assert result.status == "cancelled", result
    for _ in range(100):
        if seen:
            break
        await asyncio.sleep(0.01)
    assert seen == ["cancelled"]


def test_json_native_params_are_taken_as_parsed_and_others_go_through_pydantic() -> None:
    @dagloop.tool
    def plain(n: int, x: float, tags: list[Any], meta: dict[str, Any], flag: bool = False, anything: Any = None) -> None: ...

    @dagloop.tool
    def typed(day: datetime.date, n: int) -> None: ...

    args = plain.arguments('{"n": 2, "x": 3, "tags": ["a"], "meta": {"k": 1}}')
    assert args == {"n": 2, "x": 3.0, "tags": ["a"], "meta": {"k": 1}} and type(args["x"]) is float
    # What JSON Schema does not tell apart is converted; other types go through the model.
    assert plain.arguments('{"n": 2.0, "x": 1, "tags": [], "meta": {}}')["n"] == 2
    assert typed.arguments('{"day": "2026-11-28", "n": 1}')["day"] == datetime.date(2026, 11, 28)
    with pytest.raises(Exception, match="validation error"):
        plain.arguments('{"n": "two", "x": 1, "tags": [], "meta": {}}')
    # A param the function does not take is dropped (by the model), not passed on.
    assert "unknown" not in plain.arguments('{"n": 1, "x": 1, "tags": [], "meta": {}, "unknown": 1}')
    with pytest.raises(Exception, match="validation error"):
        typed.arguments('{"n": 1}')


class Exploding:
    """A param type whose validator raises what Pydantic does not turn into a ValidationError."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.no_info_plain_validator_function(lambda v: v // 0, json_schema_input_schema=core_schema.int_schema())


@dagloop.tool
async def checked(n: Exploding) -> int:
    return 1


async def test_a_validator_that_raises_is_the_calls_error_not_the_runs() -> None:
    """Pydantic passes on what a validator raises other than ValueError: it fails the call
    (`activity.failed`), and the run carries on."""
    model = ScriptedModel([
        ScriptedModel.solution([call(checked, n=1, output_path="†state.x || †state.err")]),
        ScriptedModel.solution(output="carried on"),
    ])
    # Escaping the take instead, it left the call unanswered and the run waiting for ever.
    result = await asyncio.wait_for(dagloop.Agent(model=model, tools=[checked]).stream("check").wait(), 30)
    assert result.status == "succeeded" and result.output == "carried on", result
    assert result.state["err"]["code"] == "activity.failed"
    assert result.state["err"]["message"] == "ZeroDivisionError: integer division or modulo by zero"


@dagloop.tool
async def in_a_task(i: int) -> bool:
    """Before any await: the call is the current task (what `asyncio.timeout`, `TaskGroup` and
    anyio's cancel scopes need), and stays it after."""
    before = asyncio.current_task()
    await asyncio.sleep(0)
    return before is not None and before is asyncio.current_task()


async def test_a_call_is_its_own_task_from_its_first_line() -> None:
    model = ScriptedModel([
        ScriptedModel.solution([call(in_a_task, i=i, output_path=f"†state.t{i}") for i in range(3)]),
        ScriptedModel.solution(output="ok"),
    ])
    result = await dagloop.Agent(model=model, tools=[in_a_task]).stream("tasks").wait()
    assert result.status == "succeeded", result
    assert [result.state[f"t{i}"] for i in range(3)] == [True, True, True]
