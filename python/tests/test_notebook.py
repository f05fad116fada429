"""examples/python/notebook.ipynb runs: its code cells, in order, in one namespace and on one
event loop as a notebook runs them (top-level `await` and `async for` included), with a scripted
model in place of `openai:gpt-4o-mini`. No Jupyter kernel is needed."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import inspect
import io
import json
from typing import Any

import dagloop
from dagloop import ScriptedModel, call

from conftest import ROOT


def code_cells() -> list[str]:
    nb = json.loads((ROOT / "examples/python/notebook.ipynb").read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


async def run_cells(cells: list[str], ns: dict[str, Any]) -> list[Any]:
    """Each cell as IPython runs it: top-level await allowed; the last expression's value kept."""
    values: list[Any] = []
    for i, src in enumerate(cells):
        tree = ast.parse(src)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        parts: list[tuple[ast.Module | ast.Expression, str]] = [(tree, "exec")]
        if isinstance(last, ast.Expr):
            parts.append((ast.Expression(last.value), "eval"))
        value = None
        for part, mode in parts:
            code = compile(part, f"notebook cell {i}", mode, flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
            value = eval(code, ns)
            if inspect.CO_COROUTINE & code.co_flags:
                value = await value
        values.append(value if last is not None else None)
    return values


def test_the_notebooks_cells_run() -> None:
    cells = code_cells()
    assert len(cells) == 3 and any("await" in c for c in cells)
    # Each run reads the script from its first turn.
    turns = [
        ScriptedModel.solution([call("temperature", city="Lisbon", output_path="†state.t")]),
        ScriptedModel.solution(output={"city": "Lisbon", "celsius": 21.5}),
    ]
    ns: dict[str, Any] = {"__name__": "__notebook__", "__model__": ScriptedModel(turns)}
    cells = [c.replace('"openai:gpt-4o-mini"', "__model__") for c in cells]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        values = asyncio.run(run_cells(cells, ns))
    weather = values[1]
    assert isinstance(weather, ns["Weather"]) and weather.city == "Lisbon" and weather.celsius == 21.5
    printed = out.getvalue()
    assert "started" in printed and "finished" in printed and "run_finished" in printed, printed
    assert printed.endswith("city='Lisbon' celsius=21.5\n"), printed
    assert isinstance(ns["run"], dagloop.RunStream)
