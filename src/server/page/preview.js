// An edit's preview: while the reviewer types an edit, the card's action (the method and URL,
// the body, the command line) follows it, described by the server with the function the card's
// own action comes from (POST /runs/{id}/approvals/{call}/preview; it performs nothing).
"use strict";

const PREVIEW_DEBOUNCE_MS = 250;
const previews = new WeakMap(); // card -> {timer, seq}

function followEdit(card, runId, callId, params) {
  const p = previews.get(card) || { timer: null, seq: 0 };
  previews.set(card, p);
  clearTimeout(p.timer);
  if (!params || typeof params !== "object" || Array.isArray(params)) return;
  p.timer = setTimeout(async () => {
    const seq = ++p.seq;
    let answer;
    try {
      answer = await api("POST", "/runs/" + encodeURIComponent(runId) + "/approvals/" + callId + "/preview", { params });
    } catch (_) {
      return; // decided meanwhile: the card says so
    }
    const shown = card.querySelector(":scope > .action");
    const next = actionView(answer || {});
    if (seq !== p.seq || !shown || !next) return;
    next.classList.add("previewed");
    next.title = "what the call would do with the params in the editor";
    shown.replaceWith(next);
  }, PREVIEW_DEBOUNCE_MS);
}
