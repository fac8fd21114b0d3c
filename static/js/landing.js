// Landing page: the tiles and the campaign rows are read again (/landing, the same {% landing %}
// fragment for the same URL query) when the page's live socket delivers a new queue snapshot
// (live.js's "tco:live" event: pushed, at most once every MIN_GAP_MS), and every FALLBACK_MS
// besides (the longest wait crosses its amber and red lines with no event; its words move every second
// with the page's clock, clock.js); the filter form is left alone so typing is never interrupted.
(function () {
  "use strict";
  var FALLBACK_MS = 30000, MIN_GAP_MS = 2000;
  // again: a refresh asked for while one was reading (a push during the fetch) runs when that one ends,
  // so the tiles never keep a figure older than the last push (it was dropped, up to FALLBACK_MS stale).
  // last: when the last read ended; the gap is counted from there, so a server slow to answer is not
  // asked again at once (counted from the read's start, a 2 s read left 0.25 s between reads).
  var busy = false, again = false, timer = null, last = 0;

  function refresh() {
    if (document.hidden) { return; }
    if (busy) { again = true; return; }
    busy = true;
    again = false;
    fetch("/landing" + location.search, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (!html) { return; }
        var doc = new DOMParser().parseFromString(html, "text/html");
        ["tiles", "my-campaigns-rows"].forEach(function (id) {
          var now = document.getElementById(id), fresh = doc.getElementById(id);
          if (now && fresh) { now.replaceWith(document.importNode(fresh, true)); }
        });
        var tiles = document.getElementById("tiles");
        if (tiles) { tiles.setAttribute("data-refreshed", new Date().toISOString()); }
      })
      .catch(function () { /* the next tick tries again; the page still shows the last figures */ })
      .then(function () { busy = false; last = Date.now(); if (again) { soon(); } });
  }

  function soon() {
    if (timer) { return; }
    timer = setTimeout(function () { timer = null; refresh(); },
                       Math.max(250, MIN_GAP_MS - (Date.now() - last)));
  }

  document.addEventListener("tco:live", function (ev) {
    if (ev.detail && ev.detail.kind === "queue.snapshot") { soon(); }
  });
  setInterval(refresh, FALLBACK_MS);
  document.addEventListener("visibilitychange", function () { if (!document.hidden) { refresh(); } });
})();
