"""`dagloop.Client` against a real `dagloop serve` (the binary cargo built), and checked against
schemas/openapi.json: the operations it calls, and every event type of the API having a typed
class with its fields."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import subprocess
from typing import Iterator

import pytest

import dagloop
from dagloop import ScriptedModel, call
from dagloop._client import OPERATIONS
from dagloop._events import _KINDS

from conftest import ROOT, dagloop_binary

OPENAPI = json.loads((ROOT / "schemas/openapi.json").read_text())


def test_the_clients_operations_are_the_documents() -> None:
    for op_id, (method, path) in OPERATIONS.items():
        op = OPENAPI["paths"].get(path, {}).get(method.lower())
        assert op is not None, f"{method} {path} is not in schemas/openapi.json"
        assert op["operationId"] == op_id


def test_every_event_of_the_api_has_a_typed_class_with_its_fields() -> None:
    schemas = OPENAPI["components"]["schemas"]
    refs = [v["$ref"].rsplit("/", 1)[1] for v in schemas["Event"]["oneOf"]]
    assert refs
    for name in refs:
        props = schemas[name]["properties"]
        kind = props["type"].get("enum", [props["type"].get("const")])[0]
        cls = _KINDS.get(kind)
        assert cls is not None, f"no class for event type {kind}"
        fields = {f.name for f in dataclasses.fields(cls)}
        missing = {("from_" if p == "from" else p) for p in props} - fields
        assert not missing, f"{cls.__name__} lacks {missing}"


def test_standing_approval_events_read_in_their_new_and_old_spelling() -> None:
    from dagloop._events import parse_event

    spec = {"scope": "tool", "tool": "refund"}
    for doc in (
        {"type": "standing_approval_added", "id": "g1", "standing": spec},
        {"type": "grant_added", "id": "g1", "grant": spec},
    ):
        e = parse_event(doc)
        assert isinstance(e, dagloop.StandingApprovalAdded) and e.standing == spec, e
    for doc in (
        {"type": "decision", "decision": {"decision": "approve"}, "standing": "g1"},
        {"type": "decision", "decision": {"decision": "approve"}, "grant": "g1"},
    ):
        d = parse_event(doc)
        assert isinstance(d, dagloop.DecisionMade) and (d.standing, d.grant) == ("g1", "g1"), d
    assert dagloop.GrantAdded is dagloop.StandingApprovalAdded


@pytest.fixture
def server(tmp_path: pathlib.Path) -> Iterator[str]:
    binary = dagloop_binary()
    assert binary.exists(), f"{binary} is missing: build it first (cargo build)"
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"grants": {"tools": ["http"], "egress": {"private": True}, "files": ["/"]}}))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "DAGLOOP_TOKEN": "py-secret"}
    proc = subprocess.Popen(
        [str(binary), "--config", str(config), "serve", "--addr", "127.0.0.1:0", "--store", str(tmp_path / "runs.db")],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
    )
    try:
        assert proc.stdout is not None
        line = json.loads(proc.stdout.readline())
        assert line["status"] == "listening", line
        yield line["url"]
    finally:
        proc.kill()
        proc.wait()


def test_a_remote_run_is_submitted_followed_decided_and_waited_for(server: str, tmp_path: pathlib.Path) -> None:
    model = ScriptedModel([
        ScriptedModel.solution([call("note", text="hello", output_path="†state.note || †state.noteError")]),
        ScriptedModel.solution(output={"ok": True}),
    ])
    goal = {
        "goal": "save a note",
        "output_schema": {"type": "object", "required": ["ok"], "properties": {"ok": {"type": "boolean"}}},
        "tools": [{
            "_tool": "note", "_activity": "http", "_http": {"method": "GET", "url": server, "timeout_s": 10},
            "description": "Reads the server's page.", "type": "object", "properties": {"text": {"type": "string"}},
        }],
    }
    with pytest.raises(dagloop.DagloopError) as e:
        dagloop.Client(server, token="wrong").submit(goal, model=model.spec())
    assert e.value.code == "auth.invalid"
    client = dagloop.Client(server, token="py-secret")
    submitted = client.submit(goal, model=model.spec(), approve="ask")
    assert not submitted.finished
    kinds = []
    for ev in client.events(submitted.id):
        kinds.append(ev.type)
        if isinstance(ev, dagloop.ApprovalRequested):
            assert ev.tool == "note" and ev.params == {"text": "hello"}
            assert client.decide(submitted.id, ev, dagloop.approve()) == "applied"
        if isinstance(ev, dagloop.RunFinished):
            break
    out = client.wait(submitted.id)
    assert out.finished and out.status == "succeeded", out
    assert out.output == {"ok": True}
    assert "approval_requested" in kinds and "decision" in kinds
    assert "note" in client.run(submitted.id)["state"]  # the approved call ran


async def test_the_async_client_streams_typed_events_and_decides(server: str) -> None:
    model = ScriptedModel([
        ScriptedModel.solution([call("note", text="hi", output_path="†state.note || †state.noteError")]),
        ScriptedModel.solution(output={"ok": True}),
    ])
    goal = {
        "goal": "save a note",
        "output_schema": {"type": "object"},
        "tools": [{
            "_tool": "note", "_activity": "http", "_http": {"method": "GET", "url": server, "timeout_s": 10},
            "description": "Reads the server's page.", "type": "object", "properties": {"text": {"type": "string"}},
        }],
    }
    client = dagloop.AsyncClient(server, token="py-secret")
    submitted = await client.submit(goal, model=model.spec(), approve="ask")
    seen: list[dagloop.Event] = []
    async for ev in client.events(submitted.id):
        seen.append(ev)
        if isinstance(ev, dagloop.ApprovalRequested):
            assert await client.decide(submitted.id, ev, dagloop.approve()) == "applied"
        if isinstance(ev, dagloop.RunFinished):
            break
    out = await client.wait(submitted.id)
    assert out.status == "succeeded" and out.output == {"ok": True}, out
    assert any(isinstance(ev, dagloop.DecisionMade) for ev in seen)
    assert "note" in (await client.run(submitted.id))["state"]
    with pytest.raises(dagloop.DagloopError) as e:
        await dagloop.AsyncClient(server, token="wrong").result(submitted.id)
    assert e.value.code == "auth.invalid"


async def test_the_async_client_follows_two_runs_at_once_on_one_loop_without_threads(server: str) -> None:
    """Natively async: two event streams read concurrently by one event loop, no worker thread
    started (the thread count never grows), each stream ending with its run's `run_finished`."""
    import asyncio
    import threading

    def goal(n: int) -> dict[str, object]:
        return {
            "goal": f"save note {n}",
            "output_schema": {"type": "object"},
            "tools": [{
                "_tool": "note", "_activity": "http", "_http": {"method": "GET", "url": server, "timeout_s": 10},
                "description": "Reads the server's page.", "type": "object", "properties": {"text": {"type": "string"}},
            }],
        }

    def model(n: int) -> str:
        return ScriptedModel([
            ScriptedModel.solution([call("note", text=f"n{n}", output_path="†state.note || †state.noteError")]),
            ScriptedModel.solution(output={"n": n}),
        ]).spec()

    threads = threading.active_count()
    client = dagloop.AsyncClient(server, token="py-secret")
    runs = [await client.submit(goal(n), model=model(n), approve="ask") for n in (1, 2)]
    counts: list[int] = []

    async def follow(run_id: str) -> list[str]:
        kinds = []
        async for ev in client.events(run_id):
            kinds.append(ev.type)
            counts.append(threading.active_count())
            if isinstance(ev, dagloop.ApprovalRequested):
                assert await client.decide(run_id, ev, dagloop.approve()) == "applied"
            if isinstance(ev, dagloop.RunFinished):
                break
        return kinds

    both = await asyncio.gather(*(follow(r.id) for r in runs))
    for kinds in both:
        assert kinds[-1] == "run_finished" and "approval_requested" in kinds and "decision" in kinds, kinds
    assert counts and max(counts) <= threads, (threads, counts)
    outs = await asyncio.gather(*(client.wait(r.id) for r in runs))
    assert [o.output for o in outs] == [{"n": 1}, {"n": 2}]
    assert threading.active_count() <= threads
