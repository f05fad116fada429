"""docs/python.md's examples, run: each ```python block in order, with a scripted model in place
of `openai:gpt-4o-mini` (the turns below answer what each example asks); a block that starts with
`# sketch` needs what the tests do not have (FastAPI, a server) and is only compiled."""

from __future__ import annotations

import ast
import contextlib
import io
import re
from typing import Any

import pytest

import dagloop
from dagloop import ScriptedModel, call

from conftest import ROOT

TURNS = {
    "A first agent": [
        ScriptedModel.solution([call("temperature", city="Lisbon", output_path="†state.t")]),
        ScriptedModel.solution(output={"city": "Lisbon", "celsius": 21.5}),
    ],
    "A reviewer in a few lines": [
        ScriptedModel.solution([call("refund", order="o1", amount=250, output_path="†state.refund")]),
        ScriptedModel.solution(output={"refunded": 100}),
    ],
    "Events": [
        ScriptedModel.solution([call("send_email", to="ada@example.com", body="hi", output_path="†state.sent")]),
        ScriptedModel.solution(output="done"),
    ],
}

EXPECT = {
    "A first agent": "city='Lisbon' celsius=21.5",
    "A reviewer in a few lines": "{'refunded': 100}",
    "Events": "succeeded",
}


def blocks() -> list[tuple[str, str]]:
    text = (ROOT / "docs/python.md").read_text()
    out, section = [], ""
    for m in re.finditer(r"^## ([^\n]+)$|^```python\n(.*?)^```", text, re.M | re.S):
        if m.group(1):
            section = m.group(1)
        else:
            out.append((section, m.group(2)))
    return out


def test_the_examples_run(monkeypatch: pytest.MonkeyPatch) -> None:
    found = blocks()
    assert len(found) >= 6
    monkeypatch.chdir(ROOT)  # the examples name files under the repository
    ran = set()
    first: dict[str, Any] = {}
    for section, code in found:
        if code.startswith("# sketch"):
            compile(code, f"docs/python.md ({section})", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
            continue
        ns: dict[str, Any] = {"__name__": "__docs__"}
        if "FastAPI(" in code:
            # The endpoint serves the first example's agent, asked about Lisbon again.
            model = ScriptedModel(TURNS["A first agent"])
            ns["agent"] = dagloop.Agent(model=model, tools=[first["temperature"]], output_type=first["Weather"])
        if '"openai:gpt-4o-mini"' in code:
            ns["__model__"] = ScriptedModel(TURNS[section])
            code = code.replace('"openai:gpt-4o-mini"', "__model__")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, f"docs/python.md ({section})", "exec"), ns)
        if section in EXPECT and "FastAPI(" not in code:
            assert EXPECT[section] in out.getvalue(), (section, out.getvalue())
        if section == "A first agent":
            first = ns
        if "FastAPI(" in code:
            check_the_endpoint(ns["app"])
            ran.add("FastAPI")
        ran.add(section)
    assert ran >= set(EXPECT) | {"Testing offline", "FastAPI"}


def check_the_endpoint(app: Any) -> None:
    """The FastAPI example streams the run's events as Server-Sent Events, then the output."""
    from fastapi.testclient import TestClient

    with TestClient(app) as client, client.stream("GET", "/weather/Lisbon") as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        text = "".join(resp.iter_text())
    frames = [f for f in text.split("\n\n") if f]
    kinds = [f.split("\n")[0].removeprefix("event: ") for f in frames]
    assert kinds[0] == "run_started" and "finished" in kinds and kinds[-2:] == ["run_finished", "output"], kinds
    assert frames[-1] == 'event: output\ndata: {"city":"Lisbon","celsius":21.5}', frames[-1]


def test_the_readmes_quick_start_runs() -> None:
    text = (ROOT / "README.md").read_text()
    found = re.findall(r"^```python\n(.*?)^```", text, re.M | re.S)
    assert len(found) == 1
    code = found[0].replace('"openai:gpt-4o-mini"', "__model__")
    ns: dict[str, Any] = {"__name__": "__readme__", "__model__": ScriptedModel(TURNS["A first agent"])}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), ns)
    assert out.getvalue().strip() == "Weather(city='Lisbon', celsius=21.5)"
