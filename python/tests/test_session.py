"""Sessions from Python: a finished stored run continued with a follow-up (`continue_from`), as
`dagloop run --continue` does it (`runs::continue_run`)."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

import dagloop
from dagloop import call


@dagloop.tool
def count(n: int) -> int:
    """Counts to n."""
    return n


async def test_a_finished_run_is_continued_with_its_state_and_history(loopback: Any, tmp_path: pathlib.Path) -> None:
    model = loopback([
        json.dumps({"calls": [call(count, n=3, output_path="†state.first")], "output": None}),
        json.dumps({"calls": [], "output": {"counted": 3}}),
        json.dumps({"calls": [call(count, n=4, output_path="†state.second")], "output": None}),
        json.dumps({"calls": [], "output": {"counted": 7}}),
    ])
    agent = dagloop.Agent(model="openai:test", tools=[count], store=tmp_path / "runs.db")
    first = await agent.stream("count to three").wait()
    assert first.succeeded and first.state["first"] == 3, first
    follow = agent.stream("now count four more", continue_from=first.run_id)
    second = await follow.wait()
    assert second.succeeded and second.output == {"counted": 7}, second
    assert second.run_id != first.run_id
    # The parent's state carried over, the follow-up's own written beside it.
    assert second.state["first"] == 3 and second.state["second"] == 4, second.state
    # The follow-up's first request carries the instruction and the session's history.
    text = json.dumps(model.requests[2]["messages"], ensure_ascii=False)
    assert "now count four more" in text and "count to three" in text, text
    # `run` gives the output of a follow-up too; the session goes on from the follow-up.
    model.answers.append(json.dumps({"calls": [], "output": {"counted": 0}}))
    assert await agent.run("stop", continue_from=second.run_id, carry="state") == {"counted": 0}


def test_continuing_needs_the_store_and_a_finished_run(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError):
        dagloop.Agent(model="openai:test").run_sync("more", continue_from="r1")
    agent = dagloop.Agent(model="openai:test", store=tmp_path / "runs.db")
    with pytest.raises(dagloop.DagloopError) as e:
        agent.run_sync("more", continue_from="no-such-run")
    assert e.value.code.startswith("store."), e.value.code
