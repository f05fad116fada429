#!/usr/bin/env python3
"""asyncio-ideal: a plain asyncio scheduler over the zero-latency workloads of
benches/scheduler.rs (the 10,000-hop chain and the 1 -> 100,000 -> 1 fan-out), stdlib only.

What a hand-written Python scheduler of the LLMCompiler kind does with the same graph, minus its
10 ms polling (peers.md, "Task Fetching Unit"): each call is a task started with
`asyncio.create_task` once its parents are done (dependency counts, no polling), its references
substituted from the finished results, its result kept in a dict by output path. No validation,
no events, no journal: the floor a Python scheduler cannot go below.

Run by benches/scheduler.rs (`cargo bench --bench scheduler`), which prints the ratio of
dagloop's time per call to this one in the same process's output. Standalone:
`python3 benches/asyncio_ideal.py [fanout0|chain0] [N]` prints one JSON line per workload.
"""

import asyncio
import json
import statistics
import sys
import time


def fanout_calls(n):
    calls = [{"tool": "work", "i": 0, "deps": [], "out": "state.root"}]
    for i in range(n):
        calls.append(
            {"tool": "work", "i": i + 1, "deps": ["state.root"], "out": f"state.mid.k{i}"}
        )
    calls.append(
        {"tool": "work", "i": n + 1, "deps": [f"state.mid.k{i}" for i in range(n)], "out": None}
    )
    return calls


def chain_calls(n):
    return [
        {
            "tool": "work",
            "i": i,
            "deps": [f"state.c{i - 1}"] if i > 0 else [],
            "out": f"state.c{i}",
        }
        for i in range(n)
    ]


async def work(params):
    """The zero-latency tool: returns 1 (the Rust bench's `work` with ms = 0)."""
    return 1


async def schedule(calls):
    """Runs every call once its parents are done; returns the results by output path."""
    state = {}
    writer = {c["out"]: k for k, c in enumerate(calls) if c["out"] is not None}
    waiting = [0] * len(calls)
    readers = [[] for _ in calls]
    for k, c in enumerate(calls):
        for d in c["deps"]:
            w = writer.get(d)
            if w is not None and w != k:
                waiting[k] += 1
                readers[w].append(k)
    left = len(calls)
    done = asyncio.get_running_loop().create_future()

    async def run(k):
        nonlocal left
        c = calls[k]
        params = {"i": c["i"], "in": [state.get(d) for d in c["deps"]]}
        result = await work(params)
        if c["out"] is not None:
            state[c["out"]] = result
        for r in readers[k]:
            waiting[r] -= 1
            if waiting[r] == 0:
                asyncio.create_task(run(r))
        left -= 1
        if left == 0:
            done.set_result(None)

    for k in range(len(calls)):
        if waiting[k] == 0:
            asyncio.create_task(run(k))
    await done
    return state


def measure(calls):
    t0 = time.perf_counter()
    asyncio.run(schedule(calls))
    return (time.perf_counter() - t0) * 1e6 / len(calls)


def main():
    only = sys.argv[1] if len(sys.argv) > 1 else None
    n = int(sys.argv[2]) if len(sys.argv) > 2 else None
    workloads = [("fanout0", fanout_calls, 100_000), ("chain0", chain_calls, 10_000)]
    for name, make, default in workloads:
        if only and only != name:
            continue
        calls = make(n or default)
        runs = sorted(measure(calls) for _ in range(3))
        print(
            json.dumps(
                {
                    "workload": name,
                    "n": len(calls),
                    "asyncio_ideal_us_per_call": round(statistics.median(runs), 3),
                    "python": sys.version.split()[0],
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
