// The triage page, live (issues 22 and 24): it follows the admin's queue view on the live path
// (/ws/queue/, the producer's snapshots; docs/live.md) and, when the waiting tasks' counts in a
// snapshot differ from the last ones, reads the page again (same URL: its filters and sort) and
// swaps its live parts ([data-live-part]: the count of waiting tasks and jobs, the reason groups, the
// job table, quotas and recent actions). The reasons come from `qstat -j` per job, so they are read
// for the admins who have this page open, at most once every MIN_GAP_MS, never by the producer for
// every change. Such a read says so (X-TCO-Live-Read): it is no page shown for the notices' count.
// Not while the admin is acting: a part with a focused field, typed text or an open "why" is kept
// and the swap is tried again at the next snapshot.
(function () {
  "use strict";
  var TCO = window.TCO;
  var WAITING = ["pending", "held", "error", "waiting"];
  var MIN_GAP_MS = 2000;
  var last = null, busy = false, again = false, lastRead = 0, timer = null;

  function waitingCounts(data) {
    var out = {};
    [["totals", data.totals], ["other", data.other_jobs]].forEach(function (pair) {
      var states = pair[1] || {};
      WAITING.forEach(function (s) { out[pair[0] + "." + s] = states[s] || 0; });
    });
    return JSON.stringify(out);
  }

  function inUse(part) {
    if (part.contains(document.activeElement) && document.activeElement !== document.body) { return true; }
    if (part.querySelector("[aria-expanded=true]")) { return true; }
    return Array.prototype.some.call(part.querySelectorAll("input[type=text], input:not([type]), input[type=number]"),
      function (input) { return input.value !== input.defaultValue; });
  }

  function swap(html) {
    var fresh = new DOMParser().parseFromString(html, "text/html");
    var kept = false;
    document.querySelectorAll("[data-live-part]").forEach(function (part) {
      var next = fresh.getElementById(part.id);
      if (!next) { return; }
      if (inUse(part)) { kept = true; return; }
      part.replaceWith(document.importNode(next, true));
    });
    if (kept) { again = true; } else { document.body.dataset.triageRead = String(Date.now()); }
  }

  function read() {
    timer = null;
    if (busy) { again = true; return; }
    busy = true; again = false; lastRead = Date.now();
    fetch(location.pathname + location.search, { credentials: "same-origin",
                                               headers: { "Accept": "text/html", "X-TCO-Live-Read": "1" } })
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
      .then(swap)
      .catch(function () { again = true; })
      .then(function () { busy = false; if (again) { schedule(); } });
  }

  function schedule() {
    if (timer !== null) { return; }
    timer = setTimeout(read, Math.max(0, lastRead + MIN_GAP_MS - Date.now()));
  }

  // When the page was read (epoch seconds, the server's clock): a first snapshot of a change committed
  // after it means the page is older than the snapshot.
  function renderedAt() {
    var part = document.getElementById("triage-live-jobs");
    return part ? parseFloat(part.dataset.renderedAt) || 0 : 0;
  }

  TCO.connect("/ws/queue/", function (msg) {
    if (msg.kind !== "queue.snapshot" || !msg.data) { return; }
    var counts = waitingCounts(msg.data);
    var newer = msg.as_of && msg.as_of.committed_at && msg.as_of.committed_at > renderedAt();
    if ((last === null && newer) || (last !== null && (counts !== last || again))) { schedule(); }
    last = counts;
  });
})();
