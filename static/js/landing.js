// Landing page: the tiles and the campaign rows are read again every REFRESH_MS while the page is
// shown (/landing, the same {% landing %} fragment for the same URL query), so the figures stay
// current without a reload; the filter form is left alone so typing is never interrupted.
(function () {
  "use strict";
  var REFRESH_MS = 10000;
  var busy = false;

  function refresh() {
    if (busy || document.hidden) { return; }
    busy = true;
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
      .then(function () { busy = false; });
  }

  setInterval(refresh, REFRESH_MS);
  document.addEventListener("visibilitychange", function () { if (!document.hidden) { refresh(); } });
})();
