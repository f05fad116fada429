"""Awaiting the native module: every async method of `dagloop._dagloop` takes a
`done(value, error)` callback that Rust calls once, from its own thread, with the GIL held.
Here it becomes an asyncio future settled on the caller's event loop."""

from __future__ import annotations

import asyncio
from typing import Any, Callable


class DagloopError(Exception):
    """A failure the library reported: `code` is stable (docs/codes.md), `message` says why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def _settle(fut: asyncio.Future[Any], value: Any, error: Any) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(DagloopError(error[0], error[1]))
    else:
        fut.set_result(value)


def native(call: Callable[..., None], *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
    """Calls `call(done, *args)` and returns a future of what `done` receives."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()

    def done(value: Any, error: Any) -> None:
        try:
            loop.call_soon_threadsafe(_settle, fut, value, error)
        except RuntimeError:
            pass  # the loop closed: nobody waits for the answer any more

    call(done, *args, **kwargs)
    return fut
