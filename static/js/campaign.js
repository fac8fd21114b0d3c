// Campaign page: progress, state counts, the forecast beside the outcome, stage table and
// distributions, a page of tasks; re-rendered from each snapshot pushed over the WebSocket.
(function () {
  "use strict";
  var el = TCO.el, num = TCO.num, secs = TCO.secs;
  var initial = TCO.json("initial-campaign");
  var live = null;

  function renderHeader(d) {
    var c = d.campaign;
    document.getElementById("campaign-status").textContent = c.status;
    document.getElementById("job-number").textContent = c.job_number === null ? "not yet submitted" : c.job_number;
    var err = document.getElementById("submit-error");
    err.hidden = !c.submit_error; err.textContent = c.submit_error || "";
    var p = document.getElementById("progress");
    p.setAttribute("aria-valuenow", d.progress_pct);
    p.querySelector(".bar").style.width = d.progress_pct + "%";
    document.getElementById("progress-text").textContent = d.ended + " of " + c.task_count + " ended (" + d.progress_pct + "%)";
    var infra = document.getElementById("infrastructure-failures");
    infra.hidden = !d.infrastructure_failures;
    infra.textContent = d.infrastructure_failures ? d.infrastructure_failures + " of the failed or lost tasks were failed by the " +
      "infrastructure (an execution host lost, the shepherd failed, tco's runner or its metering proxy did not " +
      "start), not by the agent: the control page's Retry runs " +
      "them again in one action" : "";
    var row = TCO.clear(document.querySelector("#states tbody tr"));
    Object.keys(d.states).forEach(function (s) {
      var n = d.states[s];
      row.appendChild(el("td", { "class": "num state-" + s + (n ? "" : " zero"), "data-state": s }, n));
    });
    Array.prototype.forEach.call(document.querySelectorAll("#states th"), function (th, i) { th.classList.toggle("zero", !d.states[Object.keys(d.states)[i]]); });
    var filter = TCO.clear(document.getElementById("state-filter"));
    var all = el("a", { "href": "#", "class": d.state_filter ? "" : "on", "data-filter": "" }, "all");
    all.onclick = function (e) { e.preventDefault(); choose({ state: null, page: 1 }); };
    filter.appendChild(all);
    Object.keys(d.states).forEach(function (s) {
      if (!d.states[s]) { return; }
      filter.appendChild(document.createTextNode(" · "));
      var a = el("a", { "href": "#", "class": d.state_filter === s ? "on" : "", "data-filter": s }, s + " (" + d.states[s] + ")");
      a.onclick = function (e) { e.preventDefault(); choose({ state: s, page: 1 }); };
      filter.appendChild(a);
    });
    // Per-host filter: the execution hosts the campaign's tasks ran or run on.
    var hosts = TCO.clear(document.getElementById("host-filter"));
    var anyHost = el("a", { "href": "#", "class": d.host_filter ? "" : "on", "data-host": "" }, "all hosts");
    anyHost.onclick = function (e) { e.preventDefault(); choose({ host: null, page: 1 }); };
    hosts.appendChild(anyHost);
    (d.hosts || []).forEach(function (h) {
      hosts.appendChild(document.createTextNode(" · "));
      var a = el("a", { "href": "#", "class": d.host_filter === h.host ? "on" : "", "data-host": h.host }, h.host + " (" + h.tasks + ")");
      a.onclick = function (e) { e.preventDefault(); choose({ host: h.host, page: 1 }); };
      hosts.appendChild(a);
    });
  }

  function renderStages(d) {
    var rows = d.stages.rows;
    TCO.fill(document.querySelector("#stage-table tbody"), rows.map(function (r) {
      var tr = el("tr", { "data-stage": r.stage });
      tr.appendChild(el("td", null, r.label));
      tr.appendChild(el("td", { "class": "num median" }, secs(r.median_s)));
      tr.appendChild(el("td", { "class": "num" }, secs(r.p10_s)));
      tr.appendChild(el("td", { "class": "num" }, secs(r.p90_s)));
      tr.appendChild(el("td", { "class": "num" }, secs(r.min_s)));
      tr.appendChild(el("td", { "class": "num" }, secs(r.max_s)));
      tr.appendChild(el("td", { "class": "num" }, r.n));
      return tr;
    }));
    if (!window.Plotly) { return; }
    var box = document.getElementById("stage-charts");
    rows.forEach(function (r) {
      if (r.stage === "submit") { return; }
      var id = "stage-chart-" + r.stage;
      var div = document.getElementById(id);
      if (!div) { div = el("div", { "id": id, "class": "chart small" }); box.appendChild(div); }
      var h = r.histogram;
      var x = [], y = [];
      if (h) {
        for (var i = 0; i < h.counts.length; i++) { x.push((h.edges[i] + h.edges[i + 1]) / 2); y.push(h.counts[i]); }
      }
      window.Plotly.react(div, [{ x: x, y: y, type: "bar", marker: { color: "#8fb0ef" }, name: r.label }], TCO.themed({
        title: { text: r.label + (r.median_s !== null ? " · median " + secs(r.median_s) + " s" : " · no data yet"), font: { size: 13 } },
        margin: { l: 40, r: 10, t: 30, b: 35 }, height: 200, bargap: 0.05,
        xaxis: { title: { text: "seconds" } }, yaxis: { title: { text: "tasks" } }
      }), TCO.plotConfig);
    });
    // Size the plots to their grid cells once the grid has laid them out.
    window.requestAnimationFrame(function () {
      Array.prototype.forEach.call(box.children, function (div) { window.Plotly.Plots.resize(div); });
    });
  }

  function renderTasks(d) {
    TCO.fill(document.querySelector("#tasks tbody"), d.tasks.map(function (t) {
      var tr = el("tr", { "class": "state-" + t.state, "data-task": t.id, "data-task-number": t.task_number });
      var td = el("td"); td.appendChild(el("a", { "href": "/tasks/" + t.id + "/" }, t.task_id)); tr.appendChild(td);
      var st = el("td", { "data-col": "state" }, t.state + " ");
      st.appendChild(el("span", { "class": "muted" }, t.state_code));
      if (t.runner_note) { st.appendChild(el("div", { "class": "error runner-note" }, t.runner_note)); }
      if (t.failure) { st.appendChild(el("div", { "class": "failure failure-" + t.failure.kind }, t.failure.text)); }
      tr.appendChild(st);
      tr.appendChild(el("td", null, t.host));
      tr.appendChild(el("td", { "class": "num" }, secs(t.queue_wait_s)));
      tr.appendChild(el("td", { "class": "num" }, secs(t.sandbox_start_s)));
      tr.appendChild(el("td", { "class": "num" }, secs(t.agent_work_s)));
      tr.appendChild(el("td", { "class": "num" }, secs(t.integration_overhead_s)));
      tr.appendChild(el("td", null, TCO.time(t.started_at)));
      tr.appendChild(el("td", null, TCO.time(t.ended_at)));
      tr.appendChild(el("td", { "class": "num" }, t.tokens || ""));
      tr.appendChild(el("td", { "class": "num" }, TCO.money(t.cost_usd)));
      tr.appendChild(el("td", { "class": "num", "data-col": "exit" }, num(t.exit_status)));
      tr.appendChild(el("td", { "class": "num" }, num(t.failed_code)));
      tr.appendChild(el("td", null, t.verdict));
      return tr;
    }));
    TCO.pager(document.getElementById("tasks-pager"), { page: d.page, pages: d.pages }, function (page) { choose({ page: page }); });
    var empty = document.getElementById("tasks-empty");
    empty.hidden = d.tasks.length > 0;
    empty.textContent = d.q || d.state_filter ? "No task matches" + (d.q ? " “" + d.q + "”" : "") +
      (d.state_filter ? " in state " + d.state_filter : "") + "." : "No tasks yet: the campaign is being submitted.";
    document.getElementById("task-matching").textContent = d.q ? d.matching + " matching" : "";
    Array.prototype.forEach.call(document.querySelectorAll("#tasks a.sort"), function (a) {
      var key = a.getAttribute("data-sort");
      a.setAttribute("aria-sort", d.sort === key ? (d.descending ? "descending" : "ascending") : "none");
    });
    table = { sort: d.sort, dir: d.descending ? "desc" : "asc", q: d.q || "" };
    remember(d);
  }

  // The table's state lives in the URL, so every view of it is a link (and survives a reload).
  var table = { sort: initial.sort, dir: initial.descending ? "desc" : "asc", q: initial.q || "" };
  function remember(d) {
    var params = new URLSearchParams();
    if (d.state_filter) { params.set("state", d.state_filter); }
    if (d.sort) { params.set("sort", d.sort); params.set("dir", d.descending ? "desc" : "asc"); }
    if (d.q) { params.set("q", d.q); }
    if (d.page > 1) { params.set("page", d.page); }
    var query = params.toString();
    window.history.replaceState(null, "", window.location.pathname + (query ? "?" + query : ""));
  }
  Array.prototype.forEach.call(document.querySelectorAll("#tasks a.sort"), function (a) {
    a.addEventListener("click", function (e) {
      e.preventDefault();
      var key = a.getAttribute("data-sort");
      var dir = table.sort === key ? (table.dir === "asc" ? "desc" : "asc") : (a.getAttribute("data-first") || "asc");
      document.getElementById("tasks").classList.add("loading-table");
      choose({ sort: key, dir: dir, q: table.q, page: 1 });
    });
  });
  document.getElementById("task-search").addEventListener("submit", function (e) {
    e.preventDefault();
    choose({ sort: table.sort, dir: table.dir, q: document.getElementById("task-q").value, page: 1 });
  });

  // The launch forecast beside the outcome (d.outcome: dashboards/launch/forecast_record.py outcome_view,
  // its words made on the server): every snapshot carries it, so the finish and the cost show as they come.
  function renderOutcome(d) {
    var card = document.getElementById("forecast-outcome"), o = d.outcome;
    card.hidden = !o;
    if (!o) { return; }
    document.getElementById("forecast-note").textContent = o.note;
    var widened = document.getElementById("forecast-widened");
    widened.hidden = !o.widened;
    widened.textContent = o.widened ? "The history may not have fitted these inputs, so the ranges were widened: " + o.widened + "." : "";
    TCO.fill(card.querySelector("tbody"), o.rows.map(function (r) {
      var tr = el("tr", { "data-what": r.what, "class": r.ok === false ? "outside" : r.ok ? "within" : "" });
      tr.appendChild(el("th", null, r.label));
      tr.appendChild(el("td", { "data-label": "Forecast" }, r.forecast));
      var out = el("td", { "data-label": "Outcome" }, r.outcome);
      // A late start or finish says how long past the forecast: kept moving by the page's clock (clock.js).
      out.appendChild(TCO.ticking(el("span", { "class": "verdict" }), r.verdict, r.relative));
      tr.appendChild(out);
      return tr;
    }));
  }

  function render(d) {
    renderHeader(d); renderStages(d); renderTasks(d); renderOutcome(d);
    document.getElementById("tasks").classList.remove("loading-table");
  }

  function choose(c) { if (live) { live.send(c); } }

  render(initial);
  live = TCO.connect("/ws/campaigns/" + initial.campaign.id + "/", function (msg) {
    if (msg.kind === "campaign.snapshot") { render(msg.data); }
  }, TCO.json("initial-live"));
  if (initial.page > 1 || initial.state_filter || initial.sort || initial.q || initial.host_filter) {
    live.send({ page: initial.page, state: initial.state_filter, sort: initial.sort,
                dir: initial.descending ? "desc" : "asc", q: initial.q || "", host: initial.host_filter });
  }
})();
