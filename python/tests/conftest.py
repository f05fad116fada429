"""Shared helpers for the package's tests: the repository's paths and the `dagloop` binary."""

from __future__ import annotations

import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def dagloop_binary() -> pathlib.Path:
    """The binary `cargo build` made (CARGO_TARGET_DIR, as scripts/test sets it)."""
    target = os.environ.get("CARGO_TARGET_DIR") or str(pathlib.Path.home() / ".cache/dagloop/target")
    return pathlib.Path(target) / "debug" / "dagloop"


@pytest.fixture
def root() -> pathlib.Path:
    return ROOT


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Runs `async def` tests on a fresh event loop (no plugin needed)."""
    import asyncio
    import inspect

    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    args = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    asyncio.run(pyfuncitem.obj(**args))
    return True
