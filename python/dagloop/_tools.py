"""Python functions as dagloop tools: the decorator, the tool's definition (its params' JSON
Schema from the type hints through Pydantic, its description from the docstring) and how one
call runs (a sync function in a worker thread, an async one on the event loop).

Deliberately not here: when a call runs, whether it is approved, what its result does (the
core decides all of it); a tool only answers the calls it is handed."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Callable, Literal, overload

import pydantic
import pydantic_core


class Tool:
    """A Python function the model can call. Made by `@dagloop.tool`; call it as the function."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        approval: Literal["always", "never"] | None = None,
        idempotent: bool = False,
        timeout: float | None = None,
    ) -> None:
        self.fn = fn
        self.name = name or fn.__name__
        self.description = description or inspect.cleandoc(fn.__doc__ or "") or None
        self.approval = approval
        self.idempotent = idempotent
        self.timeout = timeout
        self.is_async = inspect.iscoroutinefunction(fn)
        sig = inspect.signature(fn)
        hints = _hints(fn)
        fields: dict[str, Any] = {}
        for p in sig.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise TypeError(f"tool {self.name}: *args/**kwargs cannot be described to a model")
            ann = hints.get(p.name, Any)
            default = ... if p.default is p.empty else p.default
            fields[p.name] = (ann, default)
        self.params = pydantic.create_model(f"{self.name}_params", **fields)
        self.__doc__ = fn.__doc__
        self.__name__ = self.name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def definition(self) -> dict[str, Any]:
        """The tool as a goal file writes it (`"_activity": "rust"`: this process runs it)."""
        schema = self.params.model_json_schema()
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            if isinstance(prop, dict):
                prop.pop("title", None)
        d: dict[str, Any] = {"_tool": self.name, "_activity": "rust"}
        if self.approval is not None:
            d["_approval"] = self.approval
        if self.idempotent:
            d["_idempotent"] = True
        if self.description:
            d["description"] = self.description
        d.update(schema)
        d.setdefault("type", "object")
        return d

    async def invoke(self, params: str | bytes | dict[str, Any]) -> bytes:
        """Runs one call with `params` (resolved by the core; JSON text, or its value); returns
        the result as JSON. Raises `pydantic.ValidationError` when the params do not fit the
        signature."""
        if isinstance(params, dict):
            model = self.params.model_validate(params)
        else:
            # Straight from the JSON text: no dict of Python values made to be validated again.
            model = self.params.model_validate_json(params)
        kwargs = model.__dict__
        if self.is_async:
            work = self.fn(**kwargs)
        else:
            work = asyncio.to_thread(self.fn, **kwargs)
        if self.timeout is not None:
            result = await asyncio.wait_for(work, self.timeout)
        else:
            result = await work
        return pydantic_core.to_json(result)


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        import typing

        return typing.get_type_hints(fn)
    except Exception:  # unresolvable forward references: take the annotations as written
        return dict(getattr(fn, "__annotations__", {}))


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    approval: Literal["always", "never"] | None = None,
    idempotent: bool = False,
    timeout: float | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...
def tool(fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    """Makes a function (sync or `async def`) a tool: `@dagloop.tool` or
    `@dagloop.tool(approval="always", idempotent=True, timeout=5.0)`."""
    if fn is not None:
        return Tool(fn, **options)
    return lambda f: Tool(f, **options)
