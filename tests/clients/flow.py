"""A program using dagloop through the client openapi-python-client generates from
schemas/openapi.json: submit a goal with every call asked, follow the run's events (each parsed
into the client's model for its type), approve each call that waits, read the typed result.

Usage: PYTHONPATH=<generated client's parent> python flow.py BASE_URL GOAL_JSON
Prints one line per step; the last line is the result as JSON (tests/server_clients.rs reads it).
"""

import json
import sys

from dagloop_client import Client, models
from dagloop_client.api.approvals import decide
from dagloop_client.api.runs import create_run, list_runs, result
from dagloop_client.models import DecideRequest, DecisionName, RunOutcome, SubmitRun


def event_model(data):
    """The generated model of an event's type: `approval_requested` -> ApprovalRequestedEvent."""
    name = "".join(w.title() for w in data["type"].split("_")) + "Event"
    return getattr(models, name).from_dict(data)


def main(base, goal_path):
    client = Client(base_url=base, raise_on_unexpected_status=True, timeout=None)
    goal = json.load(open(goal_path))
    run = create_run.sync(client=client, body=SubmitRun.from_dict({"goal": goal, "approve": "ask"}))
    assert isinstance(run, RunOutcome), run
    print(f"submitted: {type(run).__name__}(id={run.id}, status={run.status}, finished={run.finished})")

    with client.get_httpx_client().stream("GET", f"/runs/{run.id}/events") as stream:
        for line in stream.iter_lines():
            if not line.startswith("data:"):
                continue
            event = event_model(json.loads(line[len("data:"):]))
            print(f"event {event.seq}: {type(event).__name__}")
            if isinstance(event, models.ApprovalRequestedEvent):
                answer = decide.sync(
                    run.id,
                    event.call_id,
                    client=client,
                    body=DecideRequest(decision=DecisionName.APPROVE, presented=event.params_hash),
                )
                print(f"  approved call {event.call_id} ({event.call.field_tool}): {answer.status}")
            # The run's own end (a delegate's agent finishes at depth 1).
            if isinstance(event, models.RunFinishedEvent) and not event.depth:
                break

    listed = list_runs.sync(client=client)
    print(f"listed: {[f'{type(r).__name__}({r.id}, {r.status})' for r in listed]}")
    out = result.sync(run.id, client=client, wait=30)
    assert isinstance(out, RunOutcome) and out.finished, out
    print(f"result: {type(out).__name__}(status={out.status}, finished={out.finished})")
    print(json.dumps(out.to_dict(), ensure_ascii=False))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
