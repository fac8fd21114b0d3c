// One clock per page (issue 24): relative times keep moving between two pushes. A quiet campaign sends
// no snapshot for minutes, and "0 s ago" written when the last one came stayed "0 s ago".
// Every element with data-at (the instant, seconds since the epoch) is written again each second with
// the words the server wrote it with (dashboards/templatetags/clock.py, dashboards/core/clock.py):
//   data-format "ago" (the default): "36 s ago", "in 41 min";
//   "duration": the time since the instant, "12 min 5 s" (schedulers/durations.py duration_text);
//   "hms": the time since the instant, "12 min 05 s" (the ops "seconds" filter);
//   "span": the time since the instant, "95 s", "12 min 05 s", "2 h 04 min" (a campaign's forecast verdict,
//   dashboards/launch/forecast_record.py span_text).
// The clock time and zone written beside them are left as they are. Time is the server's: <body
// data-server-now> (epoch seconds when the page was drawn) against this browser's clock, once. Each
// second also fires "tco:tick" (detail.now, the server's epoch seconds) for a page's own moving parts.
(function () {
  "use strict";
  var TCO = window.TCO = window.TCO || {};
  var drawn = parseFloat(document.body ? document.body.getAttribute("data-server-now") : "");
  var offset = isFinite(drawn) ? drawn - Date.now() / 1000 : 0;

  // The server's clock now, in seconds since the epoch.
  TCO.serverNow = function () { return Date.now() / 1000 + offset; };

  function nearest(seconds, unit) { return Math.floor(seconds / unit + 0.5); }
  function two(n) { return (n < 10 ? "0" : "") + n; }

  // schedulers.durations.duration_text: "42 s", "12 min 5 s", "12 min", "3 h 04 min", "2 d 5 h".
  TCO.durationText = function (seconds) {
    seconds = Math.max(0, Number(seconds));
    var whole = nearest(seconds, 1);
    if (whole < 60) { return whole + " s"; }
    if (whole < 3600) {
      var m = Math.floor(whole / 60), s = whole % 60;
      return s ? m + " min " + s + " s" : m + " min";
    }
    var minutes = nearest(seconds, 60);
    if (minutes < 48 * 60) { return Math.floor(minutes / 60) + " h " + two(minutes % 60) + " min"; }
    var hours = nearest(seconds, 3600);
    return Math.floor(hours / 24) + " d " + (hours % 24) + " h";
  };

  // Python's round() of a number of seconds: to the nearest whole, halves to even.
  function pyRound(x) {
    var total = Math.round(x);
    if (Math.abs(x - Math.floor(x)) === 0.5 && total % 2 !== 0) { total -= 1; }
    return total;
  }

  // The ops "seconds" filter: "1 h 02 min 03 s", "12 min 05 s", "5 s".
  TCO.hmsText = function (seconds) {
    var total = pyRound(Math.max(0, Number(seconds)));
    var h = Math.floor(total / 3600), m = Math.floor((total % 3600) / 60), s = total % 60;
    if (h) { return h + " h " + two(m) + " min " + two(s) + " s"; }
    if (m) { return m + " min " + two(s) + " s"; }
    return s + " s";
  };

  // forecast_record.span_text: "95 s" under 2 min, "12 min 05 s" under 2 h, then "2 h 04 min".
  TCO.spanText = function (seconds) {
    var total = pyRound(Number(seconds));
    if (total < 120) { return total + " s"; }
    if (total < 7200) { return Math.floor(total / 60) + " min " + two(total % 60) + " s"; }
    return Math.floor(total / 3600) + " h " + two(Math.floor((total % 3600) / 60)) + " min";
  };

  // dashboards.core.clock.relative's words: "36 s ago", or "in 41 min" for an instant still to come.
  TCO.relativeText = function (at, now) {
    var delta = now - at;
    return delta < 0 ? "in " + TCO.durationText(-delta) : TCO.durationText(delta) + " ago";
  };

  var FORMATS = {
    ago: TCO.relativeText,
    duration: function (at, now) { return TCO.durationText(now - at); },
    hms: function (at, now) { return TCO.hmsText(now - at); },
    span: function (at, now) { return TCO.spanText(now - at); }
  };

  // A <time data-at> for the instant ``at`` (epoch seconds) in ``format`` ("ago" by default), its words as of now.
  TCO.since = function (at, format) {
    var node = document.createElement("time");
    node.className = "ticking";
    node.setAttribute("data-at", String(at));
    if (format && format !== "ago") { node.setAttribute("data-format", format); }
    node.setAttribute("datetime", new Date(at * 1000).toISOString().replace(/\.\d+Z$/, "Z"));
    node.textContent = (FORMATS[format || "ago"] || FORMATS.ago)(at, TCO.serverNow());
    return node;
  };

  // ``text`` into ``node`` with its relative part (``mark``: {at, text[, format]}, a reason's "relative") in a
  // moving <time>: the page-side twin of the templates' "ticking" filter. Returns ``node``.
  TCO.ticking = function (node, text, mark) {
    text = text === null || text === undefined ? "" : String(text);
    var at = mark ? Number(mark.at) : NaN, i = mark && mark.text ? text.indexOf(mark.text) : -1;
    if (i < 0 || !isFinite(at) || !FORMATS[mark.format || "ago"]) {
      node.appendChild(document.createTextNode(text));
      return node;
    }
    node.appendChild(document.createTextNode(text.slice(0, i)));
    node.appendChild(TCO.since(at, mark.format));
    node.appendChild(document.createTextNode(text.slice(i + mark.text.length)));
    return node;
  };

  TCO.tick = function () {
    var now = TCO.serverNow();
    Array.prototype.forEach.call(document.querySelectorAll("[data-at]"), function (node) {
      var at = parseFloat(node.getAttribute("data-at")), format = FORMATS[node.getAttribute("data-format") || "ago"];
      if (!isFinite(at) || !format) { return; }
      var text = format(at, now);
      if (node.textContent !== text) { node.textContent = text; }
    });
    document.dispatchEvent(new CustomEvent("tco:tick", { detail: { now: now } }));
  };

  window.setInterval(TCO.tick, 1000);
})();
