"""A reviewer sends a call back with feedback (not a veto): the model's next request carries the
feedback. The model is a loopback OpenAI-compatible endpoint that keeps every request."""

from __future__ import annotations

import json
from typing import Any

import dagloop
from dagloop import call


@dagloop.tool(approval="always")
def step(n: int) -> int:
    """Takes a step of n."""
    return n


FEEDBACK = "use n = 5: the first step starts at five"


def answers() -> list[str]:
    return [
        json.dumps({"calls": [call(step, n=1, output_path="†state.a")], "output": None}),
        json.dumps({"calls": [], "output": {"done": True}}),
    ]


def carries_feedback(request: dict[str, Any]) -> bool:
    return FEEDBACK in json.dumps(request["messages"], ensure_ascii=False)


async def test_send_back_from_the_reviewer_callback_reaches_the_models_next_request(loopback: Any) -> None:
    model = loopback(answers())

    async def review(req: dagloop.ApprovalRequest) -> dagloop.Decision:
        return dagloop.send_back(FEEDBACK)

    result = await dagloop.Agent(model="openai:test", tools=[step], on_approval=review).stream("step").wait()
    assert result.output == {"done": True}, result
    assert len(model.requests) == 2
    assert not carries_feedback(model.requests[0]) and carries_feedback(model.requests[1]), model.requests[1]
    # Sent back, not run and not a veto: nothing was written.
    assert "a" not in result.state


async def test_send_back_through_run_decide_reaches_the_models_next_request(loopback: Any) -> None:
    model = loopback(answers())
    run = dagloop.Agent(model="openai:test", tools=[step]).stream("step")
    decisions: list[dagloop.DecisionMade] = []
    async for ev in run:
        if isinstance(ev, dagloop.ApprovalRequested):
            await run.decide(ev, dagloop.send_back(FEEDBACK))
        elif isinstance(ev, dagloop.DecisionMade):
            decisions.append(ev)
    result = await run.wait()
    assert result.output == {"done": True}, result
    assert [d.decision for d in decisions] == [{"decision": "send_back", "feedback": FEEDBACK}]
    assert carries_feedback(model.requests[1]), model.requests[1]


async def test_model_deltas_carry_the_text_the_provider_streamed(loopback: Any) -> None:
    answer = json.dumps({"calls": [], "output": {"greeting": "héllo, wörld"}})
    loopback([answer], chunk=5)
    run = dagloop.Agent(model="openai:test").stream("greet")
    deltas = [ev async for ev in run if isinstance(ev, dagloop.ModelDelta)]
    assert (await run.wait()).output == {"greeting": "héllo, wörld"}
    # Piece by piece as streamed, each with its text and its size in characters.
    assert len(deltas) > 5 and "".join(d.text for d in deltas) == answer
    assert all(d.chars == len(d.text) > 0 for d in deltas)
