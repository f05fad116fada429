"""Per-call overhead of a Python tool (a no-op `async def`) in a 1,000-call fan-out run by
dagloop, against the same 1,000 calls under plain `asyncio.gather`.

    $DAGLOOP_PYTHON python/bench/overhead.py [N]

dagloop's per-call figure is (a run with N calls - the same run with none) / N, so that the
model's turns and the run's set-up are not counted; the baseline's is gather's time / N. The
Python thread's CPU time per call (`time.thread_time`, the same subtraction: what the event loop
spends taking, running and answering a call, hardly touched by the machine's load) is printed too,
and the process's (`time.process_time`: the runtime's threads' too; each CPU figure is the best
of its rounds, like the wall times).
The three are measured in turn, round after round (so that a change in the machine's load touches
both sides alike), and each figure is the best of its ROUNDS (default 7). Prints both figures
and their ratio (the issue's target: <= 3x). Measure a release build of the native module:
`eval "$(DAGLOOP_PY_PROFILE=release scripts/setup-python.sh)"` (the dev build's Rust is
unoptimised, and several times slower).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import dagloop
import dagloop._dagloop
from dagloop import ScriptedModel, call


@dagloop.tool
async def noop(i: int) -> int:
    return i


def agent(n: int) -> dagloop.Agent:
    calls = [call(noop, i=i, output_path=f"†state.r{i}") for i in range(n)]
    turns = [ScriptedModel.solution(calls)] if n else []
    model = ScriptedModel(turns + [ScriptedModel.solution(output="ok")])
    return dagloop.Agent(model=model, tools=[noop], limits={"max_steps": 4})


async def timed_run(n: int) -> tuple[float, float, float]:
    """The run's wall time, the CPU time of this (the event loop's) thread meanwhile, and the
    process's (every thread's: the runtime's too)."""
    a = agent(n)
    a.model.spec()  # type: ignore[union-attr]  # the script file is written before the clock starts
    t, cpu, all_cpu = time.perf_counter(), time.thread_time(), time.process_time()
    assert await a.run("fan out") == "ok"
    return time.perf_counter() - t, time.thread_time() - cpu, time.process_time() - all_cpu


async def timed_gather(n: int) -> float:
    t = time.perf_counter()
    await asyncio.gather(*(noop.fn(i) for i in range(n)))
    return time.perf_counter() - t


async def main(n: int) -> None:
    rounds = int(os.environ.get("ROUNDS", "7"))
    empties, fulls, bases = [], [], []
    for _ in range(rounds):
        empties.append(await timed_run(0))
        fulls.append(await timed_run(n))
        bases.append(await timed_gather(n))
    empty, full, base = min(e[0] for e in empties), min(f[0] for f in fulls), min(bases)
    empty_cpu, full_cpu = min(e[1] for e in empties), min(f[1] for f in fulls)
    empty_all, full_all = min(e[2] for e in empties), min(f[2] for f in fulls)
    per_call = (full - empty) / n
    py_cpu = (full_cpu - empty_cpu) / n
    all_cpu = (full_all - empty_all) / n
    per_base = base / n
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"native module: {dagloop._dagloop.profile} build; load average {load}; best of {rounds} rounds")
    print(f"dagloop: {per_call * 1e6:.1f} us per call ({n} calls: {full * 1e3:.1f} ms, empty run {empty * 1e3:.1f} ms)")
    print(f"  of which the Python thread's CPU: {py_cpu * 1e6:.1f} us per call")
    print(f"the process's CPU (every thread): {all_cpu * 1e6:.1f} us per call (other threads: {(all_cpu - py_cpu) * 1e6:.1f} us)")
    print(f"asyncio.gather: {per_base * 1e6:.2f} us per call ({base * 1e3:.2f} ms)")
    print(f"ratio: {per_call / per_base:.1f}x (target <= 3x)")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000))
