// Fork from a step, as a tab beside the calls and the audit: a new run from this run's state,
// plan and context after step N (POST /runs/{id}/fork, `runs::fork`), optionally with another
// input or model. The fork is the caller's and is opened once created.
"use strict";

// The steps a fork may start after: 0 (right after the start) to the last step with calls.
function lastStep(run) {
  return ((run && run.calls) || []).reduce((m, c) => Math.max(m, c.step || 0), 0);
}

function renderFork(run) {
  const box = $("#fork");
  if (!run || box.dataset.run === run.id) return;
  box.dataset.run = run.id;
  const last = lastStep(run);
  const step = el("select", { id: "fork-step" },
    Array.from({ length: last + 1 }, (_, i) => el("option", { value: i, text: i === 0
      ? "0: right after the start" : "after step " + i + " (its calls and state kept)" })));
  step.value = String(last);
  const input = el("textarea", { id: "fork-input", rows: 4, spellcheck: "false",
    placeholder: "the input in place of the original's (JSON; empty: the same)" });
  const model = el("input", { id: "fork-model", type: "text", placeholder: "model from the next step on (empty: the same)" });
  const errors = el("p", { class: "form-error" });
  const go = el("button", { type: "button", id: "fork-go", class: "primary", text: "Fork",
    onclick: async () => {
      errors.textContent = "";
      const body = { at_step: Number(step.value) };
      if (input.value.trim()) {
        try {
          body.input = JSON.parse(input.value);
        } catch (e) {
          errors.textContent = "the input is not JSON: " + e.message;
          return;
        }
      }
      if (model.value.trim()) body.model = model.value.trim();
      go.disabled = true;
      try {
        const r = await api("POST", "/runs/" + encodeURIComponent(run.id) + "/fork", body);
        notice("Forked " + run.id + " after step " + body.at_step + ": " + r.id + ".", "ok");
        loadRuns();
        select(r.id);
      } catch (e) {
        errors.textContent = (e.code ? e.code + ": " : "") + e.message;
      } finally {
        go.disabled = false;
      }
    } });
  box.replaceChildren(
    el("p", { class: "muted small", text: "A new run that starts from this one's state, plan and context after the step chosen; the steps before it stand as recorded." }),
    el("label", {}, "fork ", step), input, model, el("div", { class: "buttons" }, go), errors);
}
