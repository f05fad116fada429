"""Runs in the store: a run whose process was killed (SIGKILL, mid-call) is resumed from Python
and finishes, its interrupted idempotent call run again."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import dagloop
from conftest import dagloop_binary
from dagloop import ScriptedModel, call

CHILD = textwrap.dedent(
    """
    import asyncio, json, pathlib, sys, time
    import dagloop
    from dagloop import ScriptedModel, call

    work = pathlib.Path(sys.argv[1])

    @dagloop.tool(idempotent=True)
    def slow(n: int) -> int:
        (work / "entered").write_text("yes")
        time.sleep(600)
        return n

    async def main():
        model = ScriptedModel(path=work / "script.json")
        agent = dagloop.Agent(model=model, tools=[slow], store=work / "runs.db")
        run = agent.stream("count slowly")
        await run.start()
        (work / "run_id").write_text(run.run_id)
        async for _ in run:
            pass

    asyncio.run(main())
    """
)


def test_a_killed_run_is_resumed_from_python(tmp_path: pathlib.Path) -> None:
    import json

    (tmp_path / "script.json").write_text(json.dumps({"turns": [
        ScriptedModel.solution([call("slow", n=7, output_path="†state.n")]),
        ScriptedModel.solution(output={"done": True}),
    ]}))
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)])
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "entered").exists():
            assert child.poll() is None, "the child exited before the call started"
            assert time.monotonic() < deadline, "the call never started"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
    run_id = (tmp_path / "run_id").read_text()

    # Refused (no function for its Python tool): the lease is let go, so another process may
    # take the run at once (the command line's `--no-wait` refuses only a live holder).
    with pytest.raises(dagloop.DagloopError) as refused:
        dagloop_run(dagloop.Agent(store=tmp_path / "runs.db"), run_id)
    assert refused.value.code == "agent.missing_activity", refused.value
    assert "@dagloop.tool" in refused.value.message
    other = subprocess.run(
        [str(dagloop_binary()), "resume", run_id, "--store", str(tmp_path / "runs.db"), "--no-wait"],
        capture_output=True, text=True, timeout=60,
    )
    assert "store.busy" not in other.stdout + other.stderr, other

    @dagloop.tool(idempotent=True)
    def slow(n: int) -> int:
        return n * 6

    agent = dagloop.Agent(tools=[slow], store=tmp_path / "runs.db")
    result = dagloop_run(agent, run_id)
    assert result.status == "succeeded", result
    assert result.state["n"] == 42
    # Resuming a finished run gives its stored result.
    again = dagloop_run(agent, run_id)
    assert again.status == "succeeded" and again.state == result.state


def dagloop_run(agent: dagloop.Agent, run_id: str) -> dagloop.RunResult:
    import asyncio

    async def go() -> dagloop.RunResult:
        return await agent.resume(run_id).wait()

    return asyncio.run(go())


async def test_a_stored_run_replays_identically_and_forks(tmp_path: pathlib.Path) -> None:
    @dagloop.tool
    def add(a: int, b: int) -> int:
        return a + b

    model = ScriptedModel([
        ScriptedModel.solution([call(add, a=2, b=3, output_path="†state.sum")]),
        ScriptedModel.solution(output={"done": True}),
    ])
    agent = dagloop.Agent(model=model, tools=[add], store=tmp_path / "runs.db")
    run = agent.stream("add")
    first = await run.wait()
    assert first.status == "succeeded"
    replayed = await agent.replay(first.run_id)
    assert replayed.identical and replayed.status == "succeeded" and replayed.entries > 0
    # A fork after step 1 starts from its state and asks the model for step 2.
    fork = agent.fork(first.run_id, 1, input={"again": True})
    forked = await fork.wait()
    assert forked.run_id != first.run_id
    assert forked.status == "succeeded" and forked.state["sum"] == 5 and forked.output == {"done": True}
    with __import__("pytest").raises(dagloop.DagloopError) as e:
        await agent.fork(first.run_id, 9).wait()
    assert e.value.code == "fork.no_such_step"
