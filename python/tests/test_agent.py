"""Agents from Python: Pydantic outputs (and the re-ask on an invalid one), the reviewer
callback, streamed events and decisions while iterating, goal files and cassettes."""

from __future__ import annotations

import asyncio
import pathlib
from typing import Any

import pydantic
import pytest

import dagloop
from dagloop import ScriptedModel, call

ROOT = pathlib.Path(__file__).resolve().parents[2]


class Line(pydantic.BaseModel):
    sku: str
    qty: int = pydantic.Field(ge=1)


class Refund(pydantic.BaseModel):
    amount: float
    approved: bool
    note: str | None = None
    lines: list[Line] = []


@dagloop.tool(approval="always")
def pay(amount: float) -> dict[str, Any]:
    """Pays an amount."""
    pay.seen.append(amount)  # type: ignore[attr-defined]
    return {"paid": amount}


pay.seen = []  # type: ignore[attr-defined]


async def test_the_output_is_a_pydantic_instance_and_a_bad_answer_is_re_asked() -> None:
    model = ScriptedModel([
        ScriptedModel.solution(output={"amount": "lots", "approved": True}),
        ScriptedModel.solution(output={"amount": 12.5, "approved": True, "lines": [{"sku": "a", "qty": 0}]}),
        ScriptedModel.solution(output={"amount": 12.5, "approved": True, "lines": [{"sku": "a", "qty": 2}]}),
    ])
    agent = dagloop.Agent(model=model, output_type=Refund)
    schema = agent.output_schema()
    assert schema is not None and schema["required"] == ["amount", "approved"]
    run = agent.stream("refund")
    invalid = [ev async for ev in run if isinstance(ev, dagloop.OutputInvalid)]
    out = await run.output()
    assert isinstance(out, Refund) and out.amount == 12.5 and out.lines == [Line(sku="a", qty=2)]
    # Both bad answers were refused by the run against the schema Pydantic made (a nested
    # model's `$defs` and `minimum` included) and asked again.
    assert len(invalid) == 2 and all(ev.errors for ev in invalid)


def test_an_output_that_never_validates_fails_the_run() -> None:
    model = ScriptedModel([ScriptedModel.solution(output={"amount": "lots"})] * 4)
    agent = dagloop.Agent(model=model, output_type=Refund, limits={"max_steps": 2})
    with pytest.raises(dagloop.RunFailed) as e:
        agent.run_sync("refund")
    assert not e.value.result.succeeded


async def test_the_reviewer_callback_edits_a_call() -> None:
    pay.seen.clear()  # type: ignore[attr-defined]
    shown: list[dagloop.ApprovalRequest] = []

    async def review(req: dagloop.ApprovalRequest) -> dagloop.Decision:
        shown.append(req)
        return dagloop.edit({"amount": min(req.params["amount"], 10.0)})

    model = ScriptedModel([
        ScriptedModel.solution([call(pay, amount=99.0, output_path="†state.payment")]),
        ScriptedModel.solution(output={"amount": 10.0, "approved": True}),
    ])
    out = await dagloop.Agent(model=model, tools=[pay], output_type=Refund, on_approval=review).run("pay")
    assert out.amount == 10.0
    assert pay.seen == [10.0]  # type: ignore[attr-defined]
    assert [(r.tool, r.params) for r in shown] == [("pay", {"amount": 99.0})]
    assert shown[0].action == {"kind": "other", "activity": "rust"}  # what the call would do


def test_a_run_that_asks_without_a_reviewer_is_refused_before_it_starts() -> None:
    model = ScriptedModel([ScriptedModel.solution([call(pay, amount=1.0)])])
    with pytest.raises(dagloop.DagloopError) as e:
        dagloop.Agent(model=model, tools=[pay]).run_sync("pay")
    assert e.value.code == "approval.no_reviewer"


async def test_events_stream_and_calls_are_decided_while_iterating() -> None:
    pay.seen.clear()  # type: ignore[attr-defined]
    model = ScriptedModel([
        ScriptedModel.solution(
            [call(pay, amount=5.0, output_path="†state.a || †state.no"), call(pay, amount=6.0, output_path="†state.b")],
            chunk_chars=8,
            chunk_delay_ms=1,
        ),
        ScriptedModel.solution(output={"amount": 5.0, "approved": False}),
    ])
    run = dagloop.Agent(model=model, tools=[pay], output_type=Refund).stream("pay twice")
    seen: list[dagloop.Event] = []
    async for ev in run:
        seen.append(ev)
        if isinstance(ev, dagloop.ApprovalRequested):
            amount = ev.params["amount"]
            assert ev.call_id is not None  # by the call's id: the latest presentation is quoted
            await run.decide(ev.call_id, dagloop.approve() if amount == 6.0 else dagloop.reject("too much"))
    out = await run.output()
    assert out.approved is False
    assert pay.seen == [6.0]  # type: ignore[attr-defined]
    types = [ev.type for ev in seen]
    for t in ["run_started", "model_delta", "call_received", "approval_requested", "decision", "started", "finished", "run_finished"]:
        assert t in types, (t, types)
    # Events arrive while the model streams: the first call was received (and presented)
    # before the model's answer had finished streaming.
    deltas = [i for i, ev in enumerate(seen) if isinstance(ev, dagloop.ModelDelta) and ev.step == 1]
    assert types.index("call_received") < deltas[-1] and types.index("approval_requested") < deltas[-1]
    assert [ev.seq for ev in seen if ev.type != "model_delta"] == sorted(ev.seq for ev in seen if ev.type != "model_delta")
    rejected = (await run.wait()).state["no"]
    assert rejected["code"] == "approval.rejected" and "too much" in rejected["message"], rejected


async def test_a_goal_file_runs_with_python_functions_for_its_rust_tools() -> None:
    @dagloop.tool
    def checkBillingHistory(customerId: str) -> dict[str, Any]:
        return {"customerId": customerId, "lastOrder": {"id": "ord_981", "total": 50.0, "refundable": 40.0}}

    @dagloop.tool
    def issueRefund(customerId: str, orderId: str, amount: float) -> dict[str, Any]:
        if amount > 40.0:
            raise ValueError(f"amount {amount:.2f} exceeds the refundable balance 40.00")
        return {"refundId": f"rf_{orderId}_{amount:g}", "amount": amount}

    agent = dagloop.Agent.from_goal(ROOT / "examples/refund/goal.json", tools=[checkBillingHistory, issueRefund])
    run = agent.stream()
    async for _ in run:
        pass
    result = await run.wait()
    assert result.status == "succeeded", result
    assert result.output["status"] == "partially_refunded"
    assert result.state["refundError"]["message"].startswith("ValueError: amount 50.00")


async def test_a_cassette_answers_the_calls_offline() -> None:
    agent = dagloop.Agent.from_goal(ROOT / "examples/refund/goal.json", tools_from=ROOT / "examples/refund/tools.json")
    result = await agent.stream().wait()
    assert result.status == "succeeded"
    assert result.output["refundedAmount"] == 40.0
    assert result.state["receipt"]["amount"] == 40.0


@dagloop.tool
async def linger(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "done"


async def test_a_run_is_cancelled_from_python() -> None:
    model = ScriptedModel([ScriptedModel.solution([call(linger, seconds=30, output_path="†state.x")])])
    run = dagloop.Agent(model=model, tools=[linger], approval="auto").stream("linger")
    async for ev in run:
        if isinstance(ev, dagloop.CallStarted):
            await run.cancel("enough")
    result = await run.wait()
    assert result.status == "cancelled", result


async def test_cancelling_the_task_that_waits_cancels_the_run() -> None:
    model = ScriptedModel([ScriptedModel.solution([call(linger, seconds=30, output_path="†state.x")])])
    run = dagloop.Agent(model=model, tools=[linger]).stream("linger")
    await run.start()
    waiting = asyncio.ensure_future(run.wait())
    await asyncio.sleep(0.2)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    result = await asyncio.wait_for(run.wait(), 10)
    assert result.status == "cancelled", result


async def test_the_agents_approval_policy_asks_for_every_call() -> None:
    asked: list[str] = []

    def review(req: dagloop.ApprovalRequest) -> dagloop.Decision:
        asked.append(req.tool)
        return dagloop.approve()

    model = ScriptedModel([
        ScriptedModel.solution([call(linger, seconds=0, output_path="†state.x")]),
        ScriptedModel.solution(output="ok"),
    ])
    agent = dagloop.Agent(model=model, tools=[linger], approval="ask", on_approval=review)
    assert await agent.run("linger") == "ok"
    assert asked == ["linger"]


async def test_the_input_may_be_a_pydantic_model() -> None:
    @dagloop.tool
    def echo(sku: str, qty: int) -> str:
        return f"{qty} x {sku}"

    model = ScriptedModel([
        ScriptedModel.solution([call(echo, sku="†input.sku", qty="†input.qty", output_path="†state.line")]),
        ScriptedModel.solution(output={"amount": 1.0, "approved": True}),
    ])
    run = dagloop.Agent(model=model, tools=[echo], output_type=Refund).stream("refund", input=Line(sku="b", qty=3))
    assert (await run.wait()).state["line"] == "3 x b"


async def test_a_python_tool_is_added_to_a_goal_files_agent() -> None:
    @dagloop.tool
    def audit(note: str) -> dict[str, Any]:
        """Files an audit note."""
        return {"filed": note}

    @dagloop.tool
    def checkBillingHistory(customerId: str) -> dict[str, Any]:
        return {"customerId": customerId}

    @dagloop.tool
    def issueRefund(customerId: str, orderId: str, amount: float) -> dict[str, Any]:
        return {"amount": amount}

    output = {"status": "denied", "refundedAmount": 0.0, "message": "no"}
    model = ScriptedModel([
        ScriptedModel.solution([call(audit, note="†input.customerId", output_path="†state.audit")]),
        ScriptedModel.solution(output=output),
    ])
    agent = dagloop.Agent.from_goal(
        ROOT / "examples/refund/goal.json", model=model, tools=[audit, checkBillingHistory, issueRefund]
    )
    result = await agent.stream().wait()
    assert result.status == "succeeded" and result.output == output
    assert result.state["audit"] == {"filed": "cust_123"}
