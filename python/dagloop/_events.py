"""Typed events: the run's events as the HTTP API sends them (`schemas/openapi.json`, `Event`),
one class per `type`. `parse_event` builds one from its JSON object; a type this version does
not know becomes a plain `Event` (its fields stay in `raw`).

Deliberately not here: what an event means for the run (the core's journal decides)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar


@dataclass(frozen=True)
class Event:
    """Fields every event has. `call_id` is the call it concerns (None for run-level events)."""

    type: str
    seq: int
    step: int
    at: int
    run_id: str = ""
    call_id: int | None = None
    parent: int | None = None
    depth: int = 0
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    TYPE: ClassVar[str] = ""


def _kind(name: str):  # type: ignore[no-untyped-def]
    def register(cls):  # type: ignore[no-untyped-def]
        cls.TYPE = name
        _KINDS[name] = cls
        return cls

    return register


_KINDS: dict[str, type[Event]] = {}


@_kind("run_started")
@dataclass(frozen=True)
class RunStarted(Event):
    goal: str = ""


@_kind("request_started")
@dataclass(frozen=True)
class RequestStarted(Event):
    attempt: int = 0


@_kind("model_delta")
@dataclass(frozen=True)
class ModelDelta(Event):
    """The model streamed `text` (`chars` characters; live only, never replayed)."""

    chars: int = 0
    text: str = ""


@_kind("solution")
@dataclass(frozen=True)
class Solution(Event):
    output_present: bool = False


@_kind("output_invalid")
@dataclass(frozen=True)
class OutputInvalid(Event):
    """The model's output failed the output schema; the model is asked again."""

    errors: list[str] = field(default_factory=list)


@_kind("call_received")
@dataclass(frozen=True)
class CallReceived(Event):
    call: dict[str, Any] = field(default_factory=dict)


@_kind("call_refused")
@dataclass(frozen=True)
class CallRefused(Event):
    reason: str = ""
    cycle: list[int] = field(default_factory=list)


@_kind("blocked")
@dataclass(frozen=True)
class Blocked(Event):
    waiting_on: list[str] = field(default_factory=list)


@_kind("unblocked")
@dataclass(frozen=True)
class Unblocked(Event):
    pass


@_kind("approval_requested")
@dataclass(frozen=True)
class ApprovalRequested(Event):
    """A call waits for a reviewer. `call` is resolved (references replaced by values);
    `read_from` are the calls its params were resolved from; quote `params_hash` and `seq` in
    the decision (`run.decide` does)."""

    call: dict[str, Any] = field(default_factory=dict)
    path: list[int] = field(default_factory=list)
    params_hash: str = ""
    interrupted: bool = False
    rule: str | None = None
    read_from: list[int] = field(default_factory=list)

    @property
    def tool(self) -> str:
        return str(self.call.get("_tool", ""))

    @property
    def params(self) -> dict[str, Any]:
        return {k: v for k, v in self.call.items() if not k.startswith("_")}


@_kind("decision")
@dataclass(frozen=True)
class DecisionMade(Event):
    decision: dict[str, Any] = field(default_factory=dict)
    timed_out: bool = False
    by: dict[str, Any] | None = None
    rule: str | None = None
    # The standing approval the decision came from (servers before the rename sent it as
    # `grant`; `parse_event` reads that as `standing` too, and `grant` repeats it).
    standing: str | None = None
    grant: str | None = None


@_kind("decision_dropped")
@dataclass(frozen=True)
class DecisionDropped(Event):
    decision: dict[str, Any] = field(default_factory=dict)
    by: dict[str, Any] | None = None
    presentation: int | None = None
    code: str = ""


# A reviewer's standing approval (named `grant_added` by servers before the rename; it is not
# a grant, which is what the operator lets a goal touch). `standing` is what it covers.
@_kind("standing_approval_added")
@_kind("grant_added")
@dataclass(frozen=True)
class StandingApprovalAdded(Event):
    id: str = ""
    standing: dict[str, Any] = field(default_factory=dict)
    grant: dict[str, Any] = field(default_factory=dict)
    by: dict[str, Any] | None = None


@_kind("standing_approval_revoked")
@_kind("grant_revoked")
@dataclass(frozen=True)
class StandingApprovalRevoked(Event):
    id: str = ""
    by: dict[str, Any] | None = None


# Their names before the rename, kept for one release.
GrantAdded = StandingApprovalAdded
GrantRevoked = StandingApprovalRevoked


@_kind("started")
@dataclass(frozen=True)
class CallStarted(Event):
    tool: str = ""
    params: Any = None
    read_from: list[int] = field(default_factory=list)


@_kind("call_progress")
@dataclass(frozen=True)
class CallProgress(Event):
    progress: float = 0.0
    total: float | None = None
    message: str | None = None


@_kind("finished")
@dataclass(frozen=True)
class CallFinished(Event):
    result: Any = None


@_kind("failed")
@dataclass(frozen=True)
class CallFailed(Event):
    """`error` is `{"code", "message", "details"?}`."""

    error: dict[str, Any] = field(default_factory=dict)
    kind: str = ""


@_kind("written")
@dataclass(frozen=True)
class Written(Event):
    path: str = ""
    method: str = ""
    write_seq: int = 0


@_kind("unresolved")
@dataclass(frozen=True)
class Unresolved(Event):
    missing: list[str] = field(default_factory=list)


@_kind("cancelled")
@dataclass(frozen=True)
class CallCancelled(Event):
    pass


@_kind("step_drained")
@dataclass(frozen=True)
class StepDrained(Event):
    pass


@_kind("model_retry")
@dataclass(frozen=True)
class ModelRetry(Event):
    attempt: int = 0
    status: int | None = None
    wait_ms: int = 0
    error: str = ""


@_kind("model_fallback")
@dataclass(frozen=True)
class ModelFallback(Event):
    from_: str = ""
    to: str = ""
    code: str = ""
    error: str = ""


@_kind("context_compacted")
@dataclass(frozen=True)
class ContextCompacted(Event):
    chars: int = 0
    level: int = 0
    refused_chars: int | None = None


@_kind("stream_reasked")
@dataclass(frozen=True)
class StreamReasked(Event):
    model: str = ""
    code: str = ""
    error: str = ""
    calls_kept: int = 0


@_kind("run_finished")
@dataclass(frozen=True)
class RunFinished(Event):
    status: str = ""
    by: dict[str, Any] | None = None


def parse_event(doc: dict[str, Any]) -> Event:
    """The typed event of one event object (the HTTP API's and the journal's shape)."""
    cls = _KINDS.get(doc.get("type", ""), Event)
    names = {f.name for f in fields(cls)} - {"raw"}
    kw: dict[str, Any] = {}
    for k, v in doc.items():
        key = "from_" if k == "from" else k
        if key in names:
            kw[key] = v
    # An event from before the rename names the standing approval `grant` only.
    if "standing" in names and "grant" in names:
        if kw.get("standing") is None and "grant" in kw:
            kw["standing"] = kw["grant"]
        if kw.get("grant") is None and "standing" in kw:
            kw["grant"] = kw["standing"]
    for k in ("seq", "step", "at"):
        kw.setdefault(k, 0)
    kw.setdefault("type", doc.get("type", ""))
    return cls(raw=doc, **kw)


__all__ = [
    "Event",
    "RunStarted",
    "RequestStarted",
    "ModelDelta",
    "Solution",
    "OutputInvalid",
    "CallReceived",
    "CallRefused",
    "Blocked",
    "Unblocked",
    "ApprovalRequested",
    "DecisionMade",
    "DecisionDropped",
    "StandingApprovalAdded",
    "StandingApprovalRevoked",
    "GrantAdded",
    "GrantRevoked",
    "CallStarted",
    "CallProgress",
    "CallFinished",
    "CallFailed",
    "Written",
    "Unresolved",
    "CallCancelled",
    "StepDrained",
    "ModelRetry",
    "ModelFallback",
    "ContextCompacted",
    "StreamReasked",
    "RunFinished",
    "parse_event",
]
