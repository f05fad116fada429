"""Python functions as tools: schemas from type hints, sync and async functions, a fan-out
that runs concurrently, an exception becoming the call's error."""

from __future__ import annotations

import asyncio
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
