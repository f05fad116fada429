// Standing approvals on the page (a reviewer's approvals given ahead of the calls; not a
// grant, which is what the operator lets a goal touch). On a card: "approve every call of this
// tool" (optionally only the calls whose params satisfy a JSON Schema, e.g. exactly this
// call's params) and "approve this call and the calls waiting on it, as presented" (the exact
// calls and params hashes the card shows, nothing the model adds later). Under the cards: the
// run's standing approvals, the calls each covered, and a revoke button. Everything goes
// through the API: POST /runs/{id}/standing, DELETE /runs/{id}/standing/{standing}; the run's
// description lists them under `standing`.
"use strict";

// A schema only calls with exactly these params satisfy ("only calls with these params").
function exactParamsSchema(call) {
  const params = editableParams(call);
  const properties = {};
  for (const [k, v] of Object.entries(params)) properties[k] = { const: v };
  return { type: "object", properties, required: Object.keys(params) };
}

// The body of the panel behind "Approve every <tool> call…". `give(body, what)` sends the
// standing approval; `showErrors` shows what is wrong with it before.
function allowToolPanel(call, give, showErrors) {
  const ta = el("textarea", { class: "allow-when", spellcheck: "false", rows: 5,
    placeholder: "optional: a JSON Schema the params must satisfy (empty: every call of " + call._tool + ")" });
  const exact = el("button", { type: "button", class: "allow-exact small", text: "only calls with exactly these params",
    onclick: () => { ta.value = pretty(exactParamsSchema(call)); } });
  const sendBtn = el("button", { type: "button", class: "send-allow-tool primary", text: "Approve every " + call._tool + " call",
    onclick: () => {
      const text = ta.value.trim();
      const body = { scope: "tool", tool: call._tool };
      if (text) {
        let when;
        try {
          when = JSON.parse(text);
        } catch (e) {
          showErrors([{ pointer: "", message: "the schema is not JSON: " + e.message }]);
          return;
        }
        if (when === null || (typeof when !== "object" && typeof when !== "boolean") || Array.isArray(when)) {
          showErrors([{ pointer: "", message: "a JSON Schema is an object (or true/false)" }]);
          return;
        }
        body.when = when;
      }
      give(body, "every " + call._tool + " call" + (body.when ? " whose params satisfy the schema" : ""));
    } });
  return [
    el("p", { class: "muted small", text: "Approves this call and every " + call._tool +
      " call presented while the run lasts, until the approval is revoked. A call interrupted by a restart is still asked about." }),
    ta, el("div", { class: "buttons" }, exact, sendBtn),
  ];
}

// The body of the panel behind "Approve with the calls waiting on it…": the exact list sent.
function allowCallsPanel(a, give) {
  const listed = [{ call: a.call_id, params_hash: a.params_hash }].concat(
    (a.downstream || []).map((d) => ({ call: d.call_id, params_hash: d.params_hash })));
  const row = (id, c, how) => el("li", { "data-call-id": id },
    el("code", { text: "#" + id }), " ", el("strong", { text: (c && c._tool) || "" }), " ",
    el("span", { class: "muted small", text: paramsLine(c) + " " }), el("span", { class: "muted small", text: how }));
  const list = el("ul", { class: "allow-calls-list" },
    row(a.call_id, a.call, "(as presented)"),
    (a.downstream || []).map((d) => row(d.call_id, d.call, "(as written; covered while these params stay)")));
  const sendBtn = el("button", { type: "button", class: "send-allow-calls primary",
    text: "Approve these " + listed.length + " calls",
    onclick: () => give({ scope: "calls", calls: listed }, "calls " + listed.map((c) => "#" + c.call).join(", ")) });
  return [
    el("p", { class: "muted small", text: "Approves exactly these calls, each only while its params are the ones shown here. A call the model adds later is asked about." }),
    list, el("div", { class: "buttons" }, sendBtn),
  ];
}

// What a standing approval covers, in words.
function standingText(covers) {
  if (!covers) return "";
  if (covers.scope === "tool") {
    return "every " + covers.tool + " call" + (covers.when !== undefined && covers.when !== null
      ? " whose params satisfy " + JSON.stringify(covers.when) : "");
  }
  if (covers.scope === "calls") {
    return "calls " + (covers.calls || []).map((c) => "#" + c.call).join(", ") + " as presented";
  }
  return JSON.stringify(covers);
}

// The run's standing approvals: what each covers, who gave it, the calls it approved, and
// revoke. (`grants` is the same list from a run compacted before the rename.)
function renderStanding(run) {
  const standing = run.standing || run.grants || [];
  $("#standing-section").hidden = standing.length === 0;
  $("#standing").replaceChildren(...standing.map((g) => {
    const by = g.by ? g.by.principal + " (" + g.by.channel + ")" : "somebody";
    const calls = g.calls || [];
    const revoke = !g.revoked && !finished(run)
      ? el("button", { type: "button", class: "revoke small danger", text: "Revoke",
        onclick: async (ev) => {
          ev.target.disabled = true;
          try {
            await api("DELETE", "/runs/" + encodeURIComponent(run.id) + "/standing/" + encodeURIComponent(g.id));
            notice("Standing approval " + g.id + " revoked: calls presented from now on are asked about again.", "ok");
          } catch (e) {
            ev.target.disabled = false;
            notice("Cannot revoke " + g.id + ": " + (e.code ? e.code + ": " : "") + e.message, "error");
          }
          scheduleRefresh();
        } })
      : null;
    return el("li", { class: "standing", "data-standing-id": g.id, "data-revoked": g.revoked ? "true" : "false" },
      el("code", { class: "standing-id", text: g.id }), " ",
      el("span", { class: "standing-covers", text: standingText(g.covers) }), " ",
      el("span", { class: "muted small", text: "by " + by }), " ",
      el("span", { class: "standing-calls small", "data-calls": calls.join(","),
        text: calls.length ? "approved " + calls.map((c) => "#" + c).join(", ") : "approved no call yet" }), " ",
      g.revoked ? el("span", { class: "badge", "data-status": "revoked", text: "revoked" }) : null,
      revoke);
  }));
}
