"""dagloop from Python: tools are Python functions, outputs are Pydantic models, runs are
driven by the dagloop library (the same code as the `dagloop` command line) through its native
module `dagloop._dagloop`. See docs/python.md."""

import atexit as _atexit

from . import _dagloop as _native
from ._agent import (
    Agent,
    ApprovalRequest,
    Decision,
    Replay,
    RunFailed,
    RunResult,
    RunStream,
    ScriptedModel,
    approve,
    call,
    edit,
    reject,
)
from ._bridge import DagloopError
from ._client import Client, RunOutcome
from ._events import (
    Event,
    RunStarted,
    RequestStarted,
    ModelDelta,
    Solution,
    OutputInvalid,
    CallReceived,
    CallRefused,
    Blocked,
    Unblocked,
    ApprovalRequested,
    DecisionMade,
    DecisionDropped,
    GrantAdded,
    GrantRevoked,
    CallStarted,
    CallProgress,
    CallFinished,
    CallFailed,
    Written,
    Unresolved,
    CallCancelled,
    StepDrained,
    ModelRetry,
    ModelFallback,
    ContextCompacted,
    StreamReasked,
    RunFinished,
    parse_event,
)
from ._tools import Tool, tool

# Nothing is handed back to Python once the interpreter exits (runs still going are left to
# their store, as a killed process leaves them).
_atexit.register(_native._exiting)

__all__ = [
    "Agent",
    "ApprovalRequest",
    "Client",
    "DagloopError",
    "Decision",
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
    "Replay",
    "RunFailed",
    "RunOutcome",
    "RunResult",
    "RunStream",
    "ScriptedModel",
    "Tool",
    "approve",
    "call",
    "edit",
    "parse_event",
    "reject",
    "tool",
]
