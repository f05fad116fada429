"""Python functions as dagloop tools: the decorator, the tool's definition (its params' JSON
Schema from the type hints through Pydantic, its description from the docstring), a call's
arguments from its params (Pydantic's validation, skipped for JSON-native params that already
have their types) and how one call runs (a sync function in a worker thread, an async one on the
event loop).

Deliberately not here: when a call runs, whether it is approved, what its result does (the
core decides all of it); a tool only answers the calls it is handed."""

from __future__ import annotations

import asyncio
import inspect
import typing
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
        # With `Annotated` kept: a param with validators or constraints is not plain.
        exact = _hints(fn, include_extras=True)
        fields: dict[str, Any] = {}
        # Each param's Python type when every param is JSON-native (str, int, float, bool, Any,
        # dict, list): such params need no conversion but float's from a JSON integer.
        plain: dict[str, Any] | None = {}
        self._names = frozenset(sig.parameters)
        for p in sig.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise TypeError(f"tool {self.name}: *args/**kwargs cannot be described to a model")
            ann = hints.get(p.name, Any)
            default = ... if p.default is p.empty else p.default
            fields[p.name] = (ann, default)
            if plain is not None:
                t = _json_native(exact.get(p.name, Any))
                plain = None if t is None else {**plain, p.name: t}
        self._plain = plain
        # The `int` and `float` params of a plain signature: JSON Schema's integer and number
        # leave a JSON `2.0` or `2` either way.
        self._numbers = tuple((k, t) for k, t in (plain or {}).items() if t in (int, float))
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

    def arguments(self, params: str | bytes) -> dict[str, Any]:
        """The function's keyword arguments for a call's params (JSON text), which the core
        checked against the tool's JSON Schema (`definition`). When every param's Python type is
        JSON's, the params are taken as parsed: only what JSON Schema does not tell apart is
        converted (a whole number for an `int` param, a JSON integer for a `float` one), and a
        param left out takes the function's default (a required one cannot be: the schema says
        so; called without it, the function raises `TypeError`). Anything else (dates, models, a param the
        function does not take, a value of the wrong type) goes through the Pydantic model,
        which converts and raises `pydantic.ValidationError` when the params do not fit."""
        if self._plain is not None:
            kwargs = pydantic_core.from_json(params)
            if type(kwargs) is dict and kwargs.keys() <= self._names:
                for k, t in self._numbers:
                    v = kwargs.get(k)
                    if type(v) is t or v is None:
                        continue
                    if t is float and type(v) is int:
                        kwargs[k] = float(v)
                    elif t is int and type(v) is float and v.is_integer():
                        kwargs[k] = int(v)
                    else:
                        break
                else:
                    return kwargs
        model: pydantic.BaseModel = self.params.model_validate_json(params)
        return model.__dict__

    async def invoke(self, params: str | bytes | dict[str, Any]) -> bytes:
        """Runs one call with `params` (resolved by the core; JSON text, or its value); returns
        the result as JSON. Raises `pydantic.ValidationError` when the params do not fit the
        signature."""
        if isinstance(params, dict):
            return await self.run(self.params.model_validate(params).__dict__)
        return await self.run(self.arguments(params))

    async def run(self, kwargs: dict[str, Any]) -> bytes:
        """Runs one call with its arguments (`arguments`); returns the result as JSON."""
        if self.is_async:
            work = self.fn(**kwargs)
        else:
            work = asyncio.to_thread(self.fn, **kwargs)
        if self.timeout is not None:
            result = await asyncio.wait_for(work, self.timeout)
        else:
            result = await work
        return pydantic_core.to_json(result)


def _json_native(ann: Any) -> type | None:
    """The Python type JSON parsing gives a param annotated `ann` as is (`object`: any value),
    or None when Pydantic has to convert or check it."""
    if ann is Any:
        return object
    if ann in (str, int, float, bool, dict, list):
        return ann  # type: ignore[no-any-return]
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is dict and args in ((str, Any), ()):
        return dict
    if origin is list and args in ((Any,), ()):
        return list
    return None


def _hints(fn: Callable[..., Any], include_extras: bool = False) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn, include_extras=include_extras)
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
