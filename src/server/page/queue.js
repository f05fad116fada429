// The queue across runs: "next waiting call" (the button, or `n`) opens the call that has
// waited longest for a decision in any run the reviewer may see, with its card focused; pressed
// on that call, it goes on to the next one.
"use strict";

// Every call awaiting a decision in the waiting runs (the first page of them), oldest first:
// [{run, call, at}] with `at` when it was presented (ms since the epoch).
async function waitingCalls() {
  const runs = await api("GET", "/runs?status=waiting&limit=50");
  const views = await Promise.all((Array.isArray(runs) ? runs : []).map((r) =>
    api("GET", "/runs/" + encodeURIComponent(r.id)).catch(() => null)));
  const queue = [];
  for (const v of views) {
    if (!v) continue;
    const calls = new Map((v.calls || []).map((c) => [c.id, c]));
    for (const a of v.awaiting || []) {
      const c = calls.get(a.call_id);
      const asked = c && c.asked_ms !== undefined ? c.asked_ms : 0;
      queue.push({ run: v.id, call: a.call_id, at: (v.started_at || 0) + asked });
    }
  }
  queue.sort((a, b) => a.at - b.at || a.run.localeCompare(b.run) || a.call - b.call);
  return queue;
}

// The card the reviewer chose (with j/k, a link or this queue): its run and call.
function shownCall() {
  const card = page.current ? liveCards().find((c) => c.dataset.key === page.current) : null;
  return card && page.selected ? { run: page.selected, call: Number(card.dataset.callId) } : null;
}

async function nextWaiting() {
  let queue;
  try {
    queue = await waitingCalls();
  } catch (e) {
    notice("Cannot list the waiting calls: " + e.message, "error");
    return;
  }
  if (!queue.length) {
    notice("No call is waiting for a decision.", "ok");
    return;
  }
  const here = shownCall();
  const at = here ? queue.findIndex((q) => q.run === here.run && q.call === here.call) : -1;
  const next = queue[at >= 0 ? (at + 1) % queue.length : 0];
  openCall(next.run, next.call);
}

// Opens `run` with the card of `call` focused (as a notification's link does).
function openCall(run, call) {
  // One card is the linked one: the one this queue (or a link) opened last.
  for (const c of document.querySelectorAll("#approvals .approval.linked")) c.classList.remove("linked");
  page.focusCall = call;
  if (page.selected === run) {
    page.current = null;
    refreshRun();
  } else {
    select(run);
  }
}
