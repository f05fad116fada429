// Keyboard shortcuts, like the terminal reviewer's: j/k move between the cards awaiting a
// decision, a approves the current card's call, A opens its "approve every call of this tool"
// standing approval, e opens its editor, r its rejection reason, n opens the next waiting call of any run,
// ? shows the help. Nothing fires while the reviewer types in a field (Esc leaves the field).
"use strict";

function liveCards() {
  return Array.from(document.querySelectorAll("#approvals .approval:not(.decided):not(.sent)"));
}

// The card the shortcuts act on (the first one when none was chosen).
function currentCard() {
  const cards = liveCards();
  return cards.find((c) => c.dataset.key === page.current) || cards[0] || null;
}

function markCurrent() {
  const cur = page.current;
  for (const c of document.querySelectorAll("#approvals .approval")) {
    c.classList.toggle("current", c.dataset.key === cur && !c.classList.contains("decided"));
  }
}

function moveCard(by) {
  const cards = liveCards();
  if (!cards.length) return;
  let i = cards.findIndex((c) => c.dataset.key === page.current);
  i = i < 0 ? (by > 0 ? 0 : cards.length - 1) : Math.min(Math.max(i + by, 0), cards.length - 1);
  page.current = cards[i].dataset.key;
  markCurrent();
  cards[i].focus({ preventScroll: true });
  cards[i].scrollIntoView({ block: "nearest" });
}

function typingIn(target) {
  if (!target || !target.tagName) return false;
  const tag = target.tagName.toLowerCase();
  return tag === "input" || tag === "textarea" || tag === "select" || target.isContentEditable;
}

function toggleHelp(show) {
  const h = $("#help");
  h.hidden = show === undefined ? !h.hidden : !show;
}

function onKey(e) {
  if (e.key === "Escape") {
    if (typingIn(e.target)) e.target.blur();
    toggleHelp(false);
    return;
  }
  if (e.ctrlKey || e.metaKey || e.altKey || typingIn(e.target)) return;
  const act = (cls) => {
    const card = currentCard();
    if (!card) return;
    page.current = card.dataset.key;
    markCurrent();
    const b = card.querySelector(".buttons > button." + cls);
    if (b && !b.disabled) b.click();
  };
  switch (e.key) {
    case "j": moveCard(1); break;
    case "k": moveCard(-1); break;
    case "a": act("approve"); break;
    case "A": act("allow-tool"); break;
    case "e": act("edit"); break;
    case "r": act("reject"); break;
    case "n": nextWaiting(); break;
    case "?": toggleHelp(); break;
    default: return;
  }
  e.preventDefault();
}

function setupKeys() {
  document.addEventListener("keydown", onKey);
  $("#help-button").addEventListener("click", () => toggleHelp());
}
