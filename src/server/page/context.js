// What the reviewer decides in the light of: the run's goal (its text), its input and who
// submitted it, beside the cards; and how long the run has lasted, counted on while it goes on.
// And the model's `thoughts`, step by step (journaled with its turns), so that a call is read
// with what the model said it was doing.
"use strict";

// Shows the goal, the input and the submitter of `run` (GET /runs/{id}: goal, input,
// submitted_by).
function renderContext(run) {
  const box = $("#context");
  const goal = typeof run.goal === "string" ? run.goal : "";
  box.hidden = !goal && run.input === undefined && !run.submitted_by;
  $("#ctx-goal").textContent = goal || "—";
  const hasInput = run.input !== undefined && run.input !== null;
  $("#ctx-input").textContent = hasInput ? pretty(run.input) : "";
  $("#ctx-submitter").textContent = run.submitted_by || "";
  // A goal without input, a run started without a server: the row is left out.
  for (const e of document.querySelectorAll("#context .ctx-input")) e.hidden = !hasInput;
  for (const e of document.querySelectorAll("#context .ctx-submitter")) e.hidden = !run.submitted_by;
  renderThoughts(run);
}

// Each step's thoughts, latest first (the step whose calls await a decision is usually it).
function renderThoughts(run) {
  const list = Array.isArray(run.thoughts) ? run.thoughts.slice().reverse() : [];
  $("#ctx-thoughts").hidden = list.length === 0;
  if (list.length) $("#context").hidden = false;
  $("#thoughts").replaceChildren(...list.map((t) => el("li", { class: "thought", "data-step": t.step },
    el("span", { class: "muted small", text: "step " + t.step +
      (t.delegate_call ? " (nested agent of call #" + t.delegate_call + ")" : "") + ": " }),
    el("span", { class: "thought-text",
      text: typeof t.thoughts === "string" ? t.thoughts : JSON.stringify(t.thoughts) }))));
}

// How long the run has lasted: from its first event to its last once it ended, to now while a
// process drives it or it waits for a reviewer.
function runDuration(run) {
  if (!finished(run) && typeof run.started_at === "number") {
    return Math.max(Date.now() - run.started_at, run.duration_ms || 0);
  }
  return run.duration_ms;
}

function renderDuration(run) {
  $("#run-duration").textContent = fmtMs(runDuration(run)) + " · " + run.journal_entries + " journal entries";
}

// The header's duration goes on counting each second while the run is live.
function tickDuration() {
  if (page.run && page.run.id === page.selected && !finished(page.run)) renderDuration(page.run);
}
