// Dismissible notices ("campaign finished", anomaly alerts): a dismissed notice stays hidden in this
// browser (localStorage, keyed by campaign and finish time) until it ages out on the server. A notice
// expires on the page too: data-expires-in (seconds from when the server drew it) removes it, or one of
// the others a "campaign finished" notice lists, when it is too old, from a page left open (the live
// pages are never reloaded, and a stale "Campaign finished" stayed on them).
(function () {
  "use strict";
  var KEY = "tco.dismissed-notices";
  function load() {
    try { return JSON.parse(window.localStorage.getItem(KEY) || "[]"); } catch (e) { return []; }
  }
  function save(list) {
    try { window.localStorage.setItem(KEY, JSON.stringify(list.slice(-200))); } catch (e) { /* private mode */ }
  }
  // A list left without notices goes; a "more" list recounts what it still names.
  function tidy() {
    document.querySelectorAll("details.more-notices").forEach(function (more) {
      var left = more.querySelectorAll(".more-notice").length;
      if (!left) { more.remove(); return; }
      var summary = more.querySelector("summary");
      if (summary) { summary.textContent = "and " + left + " more"; }
    });
    document.querySelectorAll("ul.notices").forEach(function (list) {
      if (!list.querySelector("li")) list.remove();
    });
  }
  var dismissed = load();
  document.querySelectorAll("[data-notice]").forEach(function (item) {
    var id = item.getAttribute("data-notice");
    if (dismissed.indexOf(id) >= 0) { item.remove(); return; }
    var button = item.querySelector("button.dismiss");
    if (!button) return;
    button.addEventListener("click", function () {
      dismissed = load();
      if (dismissed.indexOf(id) < 0) dismissed.push(id);
      save(dismissed);
      item.remove();
      tidy();
    });
  });
  document.querySelectorAll("[data-expires-in]").forEach(function (item) {
    var seconds = parseFloat(item.getAttribute("data-expires-in"));
    if (!isFinite(seconds)) { return; }
    // setTimeout takes at most 2^31 - 1 ms (24.8 days); a notice lives hours.
    window.setTimeout(function () { item.remove(); tidy(); }, Math.min(Math.max(0, seconds) * 1000, 2147483647));
  });
  tidy();
})();
