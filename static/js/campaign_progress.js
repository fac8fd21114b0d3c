// The campaign control page's progress, kept live: every few seconds it reads the campaign's
// state counts from /api/campaigns/<id>/ (the same figures as the campaign page) and redraws the
// bar, the counts and the status beside the controls, and the facts table's status and task counts. When the status, job or task counts change,
// it redraws the Control box from the server (<div id="control-buttons" data-url>), so Pause,
// Resume, Cancel and Retry are offered as the campaign is now. It stops when the campaign is finished.
(function () {
  "use strict";
  const box = document.getElementById("progress");
  if (!box || !window.fetch) return;
  const url = box.dataset.api;
  const bar = document.getElementById("progress-bar");
  const text = document.getElementById("progress-text");
  const states = document.getElementById("progress-states");
  const live = document.getElementById("progress-live");
  const PERIOD_MS = 3000;
  const buttons = document.getElementById("control-buttons");
  let shownFor = null;  // the status, job and counts the Control box was last drawn for

  function redrawControls(c, states) {
    if (!buttons || !buttons.dataset.url) return;
    const key = JSON.stringify([c.status, c.job_number, states]);
    if (key === shownFor) return;  // null at first: the page may be older than the first reading
    shownFor = key;
    fetch(buttons.dataset.url, {credentials: "same-origin", headers: {"Accept": "text/html"}})
      .then(function (r) { if (!r.ok) throw new Error(r.status); return r.text(); })
      .then(function (html) {
        const doc = new DOMParser().parseFromString(html, "text/html");
        buttons.replaceChildren.apply(buttons, Array.from(doc.body.childNodes));
      })
      .catch(function () { shownFor = null; });  // try again on the next change
  }

  function badge(state, n) {
    const span = document.createElement("span");
    span.className = "badge state-" + state;
    span.dataset.state = state;
    span.textContent = n + " " + state;
    return span;
  }

  function draw(data) {
    const c = data.campaign;
    bar.value = data.progress_pct;
    bar.textContent = data.progress_pct + "%";
    text.replaceChildren();
    const strong = document.createElement("strong");
    strong.textContent = String(data.ended);
    text.append(strong, " of " + c.task_count + " task" + (c.task_count === 1 ? "" : "s") + " ended (" +
      data.progress_pct + "%)" + (data.failures ? ", " + data.failures + " failed" : "") + "; status ");
    const status = document.createElement("span");
    status.id = "progress-status";
    status.textContent = c.status;
    text.append(status);
    // The details below say the same: status and job number.
    const detailStatus = document.getElementById("status");
    if (detailStatus) {
      const b = document.createElement("span");
      b.className = "badge status-" + c.status;
      b.textContent = c.status;
      detailStatus.replaceChildren(b);
    }
    // The facts' task count follows the same reading ("10 held", not the page's "10 pending").
    const count = document.getElementById("task-count");
    if (count) {
      const parts = Object.keys(data.states).filter(function (s) { return data.states[s]; })
        .map(function (s) { return data.states[s] + " " + s; });
      count.textContent = c.task_count + (parts.length ? " (" + parts.join(", ") + ")" : " (none seen by the scheduler yet)");
    }
    const job = document.getElementById("job-number");
    if (job && c.job_number) job.textContent = String(c.job_number);
    states.replaceChildren();
    Object.keys(data.states).forEach(function (s) {
      if (data.states[s]) { states.append(badge(s, data.states[s]), " "); }
    });
    redrawControls(c, data.states);
    return c.status !== "finished" && c.status !== "rejected";
  }

  function tick() {
    fetch(url, {credentials: "same-origin", headers: {"Accept": "application/json"}})
      .then(function (r) { if (!r.ok) throw new Error(r.status); return r.json(); })
      .then(function (data) {
        live.hidden = false;
        if (draw(data)) setTimeout(tick, PERIOD_MS);
      })
      .catch(function () { live.hidden = true; setTimeout(tick, PERIOD_MS * 3); });
  }
  setTimeout(tick, 500);
})();
