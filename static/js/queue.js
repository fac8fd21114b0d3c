// Live queue page: renders the scoped snapshot the server pushes over the
// WebSocket. No polling; on a dropped connection it reconnects with backoff.
(function () {
  "use strict";
  var STATES = null;

  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    if (attrs) { Object.keys(attrs).forEach(function (k) { node.setAttribute(k, attrs[k]); }); }
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    return node;
  }
  function num(v, digits) {
    if (v === null || v === undefined) { return ""; }
    return digits === undefined ? String(v) : Number(v).toFixed(digits);
  }
  function fillRows(tbody, rows) {
    while (tbody.firstChild) { tbody.removeChild(tbody.firstChild); }
    rows.forEach(function (r) { tbody.appendChild(r); });
  }

  function renderClusters(data) {
    var box = document.getElementById("clusters");
    while (box.firstChild) { box.removeChild(box.firstChild); }
    data.clusters.forEach(function (c) {
      var head = el("p", null, "Cluster " + c.name + " · last poll " + (c.polled_at || "never"));
      box.appendChild(head);
      if (c.poll_error) { box.appendChild(el("p", { "class": "error" }, "Last poll failed: " + c.poll_error)); }
      var t = el("table", { "class": "grid", "id": "queues-" + c.name });
      var h = el("tr");
      ["Queue", "Slots used", "Reserved", "Available", "Total"].forEach(function (x) { h.appendChild(el("th", null, x)); });
      var thead = el("thead"); thead.appendChild(h); t.appendChild(thead);
      var tb = el("tbody");
      c.queues.forEach(function (q) {
        var tr = el("tr", { "data-queue": q.name });
        tr.appendChild(el("td", null, q.name));
        tr.appendChild(el("td", { "class": "num slots-used" }, q.used));
        tr.appendChild(el("td", { "class": "num" }, q.resv));
        tr.appendChild(el("td", { "class": "num" }, q.available));
        tr.appendChild(el("td", { "class": "num slots-total" }, q.total));
        tb.appendChild(tr);
      });
      t.appendChild(tb); box.appendChild(t);
      if (c.seats) {
        box.appendChild(el("p", { "id": "seats" }, "Model API seats (consumable " + c.seats.resource + ", global): " +
          num(c.seats.used, 0) + " of " + num(c.seats.capacity, 0) + " in use"));
      }
      c.quotas.forEach(function (q) {
        box.appendChild(el("p", { "class": "quota" }, "Quota " + q.rule + ": " + q.resource + " " + num(q.used) + " of " + num(q.limit)));
      });
    });
  }

  function stateCells(tr, states) {
    STATES.forEach(function (s) {
      var n = states[s] || 0;
      tr.appendChild(el("td", { "class": "num state-" + s + (n ? "" : " zero"), "data-state": s }, n));
    });
  }

  function render(data) {
    STATES = data.states;
    document.getElementById("generated-at").textContent = data.generated_at;
    renderClusters(data);
    var rows = data.campaigns.map(function (c) {
      var tr = el("tr", { "data-campaign": c.id });
      var td = el("td"); var a = el("a", { "href": "/campaigns/" + c.id + "/" }, c.name); td.appendChild(a); tr.appendChild(td);
      tr.appendChild(el("td", null, c.team));
      tr.appendChild(el("td", { "class": "num" }, c.job_number === null ? "" : c.job_number));
      tr.appendChild(el("td", { "class": "num" }, c.task_count));
      tr.appendChild(el("td", null, c.status));
      stateCells(tr, c.states);
      return tr;
    });
    fillRows(document.querySelector("#campaigns tbody"), rows);
    document.getElementById("no-campaigns").hidden = rows.length > 0;
    var otherCard = document.getElementById("other-jobs-card");
    if (data.other_jobs) {
      otherCard.hidden = false;
      var tr = el("tr"); stateCells(tr, data.other_jobs);
      fillRows(document.querySelector("#other-jobs tbody"), [tr]);
    }
    fillRows(document.querySelector("#finished tbody"), data.recent_finished.map(function (t) {
      var tr = el("tr", { "class": "state-" + t.state, "data-task": t.task_id });
      tr.appendChild(el("td", null, t.task_id));
      tr.appendChild(el("td", null, t.campaign || ""));
      tr.appendChild(el("td", null, t.state));
      tr.appendChild(el("td", null, t.project));
      tr.appendChild(el("td", null, t.host));
      tr.appendChild(el("td", { "class": "num" }, num(t.wallclock_s, 0)));
      tr.appendChild(el("td", { "class": "num" }, num(t.exit_status)));
      tr.appendChild(el("td", { "class": "num" }, num(t.failed_code)));
      tr.appendChild(el("td", null, t.ended_at ? t.ended_at.replace("T", " ").replace(/\.\d+/, "").replace("Z", "") : ""));
      return tr;
    }));
  }

  function setLive(on) {
    var b = document.getElementById("live");
    b.textContent = on ? "live" : "reconnecting…";
    b.className = "badge " + (on ? "on" : "off");
  }

  var delay = 500;
  function connect() {
    var proto = location.protocol === "https:" ? "wss://" : "ws://";
    var ws = new WebSocket(proto + location.host + "/ws/queue/");
    ws.onopen = function () { delay = 500; setLive(true); };
    ws.onmessage = function (ev) {
      var msg = JSON.parse(ev.data);
      if (msg.kind === "queue.snapshot") { render(msg.data); }
    };
    ws.onclose = function () {
      setLive(false);
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 10000);
    };
  }

  render(JSON.parse(document.getElementById("initial-summary").textContent));
  connect();
})();
