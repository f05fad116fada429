"""Answers handed back in batches (`_dagloop.answer`, one wake-up of the run's threads per
batch): in a 1,000-call fan-out of tools that answer at once, await, or raise (before or after
their first await), every call gets its own answer; a run cancelled while calls wait for their
answers ends cleanly, and answers that come after the run is over are dropped without harm."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import dagloop
from dagloop import ScriptedModel, call
from dagloop import _dagloop as _native


@dagloop.tool
async def mixed(i: int) -> dict[str, Any]:
    """Answers at once, awaits first, or raises (before or after an await), by `i % 4`."""
    kind = i % 4
    if kind == 1:
        await asyncio.sleep(0.001 * (i % 7))
    elif kind == 2:
        raise ValueError(f"no {i}")
    elif kind == 3:
        await asyncio.sleep(0)
        raise KeyError(i)
    return {"i": i}


async def test_a_thousand_answers_in_batches_each_reach_its_own_call() -> None:
    n = 1000
    model = ScriptedModel([
        ScriptedModel.solution([call(mixed, i=i, output_path=f"†state.r{i} || †state.e{i}") for i in range(n)]),
        ScriptedModel.solution(output="ok"),
    ])
    result = await dagloop.Agent(model=model, tools=[mixed], limits={"max_steps": 4}).stream("fan out").wait()
    assert result.status == "succeeded", result
    for i in range(n):
        kind = i % 4
        if kind in (0, 1):
            assert result.state[f"r{i}"] == {"i": i}, i
            assert f"e{i}" not in result.state, i
        else:
            err = result.state[f"e{i}"]
            assert err["code"] == "activity.failed", (i, err)
            want = f"ValueError: no {i}" if kind == 2 else f"KeyError: {i}"
            assert err["message"] == want, (i, err)
            assert f"r{i}" not in result.state, i


async def test_a_run_cancelled_with_calls_waiting_for_answers_ends_cleanly() -> None:
    """200 calls wait (half of them ignore the cancellation and answer anyway, after the run is
    over): the run ends `cancelled`, every waiting call is cancelled in Python, and the late
    answers are dropped with no error."""
    n = 200
    gate = asyncio.Event()
    started: list[int] = []
    cancelled: list[int] = []
    late: list[int] = []

    @dagloop.tool
    async def wait_for_gate(i: int) -> int:
        started.append(i)
        try:
            await gate.wait()
        except asyncio.CancelledError:
            cancelled.append(i)
            if i % 2:
                raise
        # A stubborn tool: it answers anyway, after its run is over (the run's end may cancel
        # it more than once).
        for _ in range(10):
            try:
                await asyncio.sleep(0.01)
                break
            except asyncio.CancelledError:
                pass
        late.append(i)
        return i

    model = ScriptedModel([
        ScriptedModel.solution([call(wait_for_gate, i=i, output_path=f"†state.r{i}") for i in range(n)]),
    ])
    run = dagloop.Agent(model=model, tools=[wait_for_gate], approval="auto").stream("wait")
    await run.start()
    for _ in range(1000):
        if len(started) == n:
            break
        await asyncio.sleep(0.01)
    assert len(started) == n
    await run.cancel("enough")
    result = await asyncio.wait_for(run.wait(), 10)
    assert result.status == "cancelled", result
    assert not any(k.startswith("r") for k in result.state), result.state
    for _ in range(200):
        if len(late) == n // 2:
            break
        await asyncio.sleep(0.01)
    assert sorted(cancelled) == list(range(n))
    assert sorted(late) == list(range(0, n, 2))
    # Every answer was handed back (to nobody), and nothing of the run is left waiting.
    await asyncio.sleep(0.05)
    assert not run._answers and not run._calls
    del run
    gc.collect()


def test_a_bad_answer_item_is_a_type_error_not_a_crash() -> None:
    """`answer` takes `(reply, result_json)` and `(reply, exception, message)` items; anything
    else is a `TypeError`, not a crash."""
    bad_items: list[list[Any]] = [[1], [(None, "1")], [("x", "y", "z", "w")]]
    for bad in bad_items:
        try:
            _native.answer(bad)
        except TypeError:
            pass
        else:
            raise AssertionError(f"answer({bad!r}) was accepted")
