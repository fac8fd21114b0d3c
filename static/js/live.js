// Shared by the live pages: DOM helpers, number formats and a WebSocket that
// reconnects with backoff. No polling: the server pushes scoped snapshots.
(function () {
  "use strict";
  var TCO = window.TCO = window.TCO || {};

  TCO.el = function (tag, attrs, text) {
    var node = document.createElement(tag);
    if (attrs) { Object.keys(attrs).forEach(function (k) { if (attrs[k] !== null && attrs[k] !== undefined) { node.setAttribute(k, attrs[k]); } }); }
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    return node;
  };
  TCO.clear = function (node) { while (node.firstChild) { node.removeChild(node.firstChild); } return node; };
  TCO.fill = function (node, children) { TCO.clear(node); children.forEach(function (c) { node.appendChild(c); }); };
  TCO.num = function (v, digits) {
    if (v === null || v === undefined || v === "") { return ""; }
    return digits === undefined ? String(v) : Number(v).toFixed(digits);
  };
  TCO.secs = function (v) {
    if (v === null || v === undefined) { return ""; }
    var a = Math.abs(v);
    return a >= 100 ? v.toFixed(0) : a >= 1 ? v.toFixed(2) : v.toFixed(3);
  };
  TCO.time = function (iso) {
    // "2026-12-01T23:23:17.5+00:00" and "...Z" alike read "2026-12-01 23:23:17 UTC" (the zone was lost for +00:00).
    return iso ? iso.replace("T", " ").replace(/\.\d+/, "").replace(/(Z|\+00:00)$/, " UTC") : "";
  };
  // A moment for people: this browser's local time ("20:01:05 CET"; with the date when not today).
  // TCO.setTime puts it in an element whose title (and <time datetime>) carries the exact ISO text.
  TCO.localTime = function (iso) {
    if (!iso) { return ""; }
    var d = new Date(iso);
    if (isNaN(d.getTime())) { return iso; }
    var opts = { hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23", timeZoneName: "short" };
    if (d.toDateString() !== new Date().toDateString()) { opts.year = "numeric"; opts.month = "short"; opts.day = "numeric"; }
    return d.toLocaleString(undefined, opts);
  };
  TCO.setTime = function (node, iso) {
    node.textContent = TCO.localTime(iso);
    node.title = iso || "";
    if (node.tagName === "TIME") { node.setAttribute("datetime", iso || ""); }
  };
  TCO.money = function (v) {
    if (v === null || v === undefined) { return ""; }
    var n = Number(v);
    return "$" + (n >= 100 ? n.toFixed(2) : n.toFixed(4));
  };
  TCO.json = function (id) { return JSON.parse(document.getElementById(id).textContent); };
  // A snapshot's tables ({columns, rows}: a campaign page's task rows, dashboards/live/snapshots.py
  // pack_rows) as the list of objects the pages draw.
  TCO.unpack = function (data) {
    if (!data) { return data; }
    ["tasks"].forEach(function (key) {
      var t = data[key];
      if (t && !Array.isArray(t) && Array.isArray(t.columns) && Array.isArray(t.rows)) {
        data[key] = t.rows.map(function (row) {
          var o = {};
          t.columns.forEach(function (c, i) { o[c] = row[i]; });
          return o;
        });
      }
    });
    return data;
  };

  function setLive(on) {
    var b = document.getElementById("live");
    if (!b) { return; }
    b.textContent = on ? "live" : "reconnecting…";
    b.className = "badge " + (on ? "on" : "off");
  }

  // connect(path, onMessage[, mark]) -> {send(obj)}; resends the last "choice" after a reconnect.
  // Each message is a whole snapshot of one view ({kind, view, seq, epoch, data}): seq counts that
  // view's snapshots. One older than, or the same as, what is shown (a page rendered from a newer one,
  // a duplicate after a resync) is skipped; a gap (seq jumped) asks the server for its latest snapshot,
  // which it sends unless this socket has it already. "mark" ({view, epoch, seq}): the page's own.
  TCO.connect = function (path, onMessage, mark) {
    var delay = 500, ws = null, choice = null, closedForGood = false, shown = {};
    if (mark && mark.view) { shown[mark.view] = { epoch: mark.epoch, seq: mark.seq }; }
    function fresh(msg) {
      if (!msg.view || msg.seq === undefined) { return true; }
      var last = shown[msg.view];
      if (last && last.epoch === msg.epoch && msg.seq <= last.seq) { return false; }
      if (last && last.epoch === msg.epoch && msg.seq > last.seq + 1 && ws && ws.readyState === 1) {
        ws.send(JSON.stringify({ snapshot: true }));
      }
      shown[msg.view] = { epoch: msg.epoch, seq: msg.seq };
      return true;
    }
    function open() {
      var proto = location.protocol === "https:" ? "wss://" : "ws://";
      ws = new WebSocket(proto + location.host + path);
      ws.onopen = function () {
        delay = 500; setLive(true);
        if (choice) { ws.send(JSON.stringify(choice)); }
      };
      ws.onmessage = function (ev) {
        var msg = JSON.parse(ev.data);
        if (fresh(msg)) {
          TCO.unpack(msg.data);
          onMessage(msg);
          // Other parts of the page follow the same push (landing.js: the tiles).
          document.dispatchEvent(new CustomEvent("tco:live", { detail: { view: msg.view, kind: msg.kind } }));
        }
      };
      ws.onclose = function (ev) {
        setLive(false);
        if (ev.code === 4401 || ev.code === 4403) {
          closedForGood = true;
          var b = document.getElementById("live");
          if (b) { b.textContent = ev.code === 4401 ? "signed out" : "no access"; }
          return;
        }
        setTimeout(open, delay);
        delay = Math.min(delay * 2, 10000);
      };
    }
    open();
    return {
      send: function (obj) {
        // Another page or filter is another view: its snapshots count from their own seq.
        shown = {};
        choice = Object.assign({}, choice || {}, obj);
        if (ws && ws.readyState === 1 && !closedForGood) { ws.send(JSON.stringify(obj)); }
      }
    };
  };

  // A pager: <nav id=...> with previous/next buttons and "page X of Y".
  TCO.pager = function (nav, info, onPage) {
    TCO.clear(nav);
    if (!info || info.pages <= 1) { nav.hidden = true; return; }
    nav.hidden = false;
    var prev = TCO.el("button", { "type": "button", "class": "pager-prev" }, "← previous");
    prev.disabled = info.page <= 1;
    prev.onclick = function () { onPage(info.page - 1); };
    var next = TCO.el("button", { "type": "button", "class": "pager-next" }, "next →");
    next.disabled = info.page >= info.pages;
    next.onclick = function () { onPage(info.page + 1); };
    nav.appendChild(prev);
    nav.appendChild(TCO.el("span", { "class": "pager-info" }, " page " + info.page + " of " + info.pages +
      (info.total !== undefined ? " (" + info.total + ")" : "") + " "));
    nav.appendChild(next);
  };

  // A Plotly layout in the page's theme (light or dark, from the stylesheet): transparent
  // backgrounds, the text colour of the page, grid lines in its line colour.
  TCO.themed = function (layout) {
    var css = getComputedStyle(document.documentElement);
    var fg = css.getPropertyValue("--fg").trim() || "#1d2330", line = css.getPropertyValue("--line").trim() || "#dde2ea";
    layout.paper_bgcolor = "rgba(0,0,0,0)"; layout.plot_bgcolor = "rgba(0,0,0,0)";
    layout.font = Object.assign({ color: fg }, layout.font || {});
    ["xaxis", "yaxis"].forEach(function (k) { layout[k] = Object.assign({ gridcolor: line, zerolinecolor: line }, layout[k] || {}); });
    return layout;
  };
  // A time axis: Plotly draws dates as given, and the server sends them in UTC, so every time axis
  // says so in its title (a tick without a zone was read as the viewer's local time).
  TCO.utcAxis = function (axis) {
    return Object.assign({ type: "date", automargin: true, title: { text: "time (UTC)" } }, axis || {});
  };
  TCO.plotConfig = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["select2d", "lasso2d"] };
})();
