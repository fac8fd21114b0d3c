// Live queue page: renders the scoped snapshot the server pushes over the
// WebSocket, and the queue-depth history as a Plotly chart.
(function () {
  "use strict";
  var el = TCO.el, num = TCO.num;
  var STATES = null, ACTIVE = null, live = null, depth = null, depthWindow = "hour";

  function stateCells(tr, states, which) {
    (which || STATES).forEach(function (s) {
      var n = states[s] || 0;
      tr.appendChild(el("td", { "class": "num state-" + s + (n ? "" : " zero"), "data-state": s }, n));
    });
  }

  function pct(v) { return v === null || v === undefined ? "" : (100 * v).toFixed(1) + " %"; }

  function emptyRow(cols, text) {
    var tr = el("tr", { "class": "empty" }); tr.appendChild(el("td", { "colspan": cols, "class": "muted" }, text)); return tr;
  }

  function renderClusters(data) {
    var box = TCO.clear(document.getElementById("clusters"));
    data.clusters.forEach(function (c) {
      // The poll's clock time, then how long ago, kept moving by the page's clock (clock.js).
      var polled = el("p", { "class": "last-poll", "data-cluster": c.name },
        "Cluster " + c.name + " · last poll " + (TCO.time(c.polled_at) || "never"));
      var at = c.polled_at ? Date.parse(c.polled_at) / 1000 : NaN;
      if (isFinite(at)) {
        polled.appendChild(document.createTextNode(" ("));
        polled.appendChild(TCO.since(at));
        polled.appendChild(document.createTextNode(")"));
      }
      box.appendChild(polled);
      box.appendChild(el("p", { "class": "muted cluster-flavour", "id": "flavour-" + c.name },
        "Scheduler " + (c.flavour || "unknown") + " · accounting file " + (c.accounting_path || "not set")));
      if (c.poll_error) { box.appendChild(el("p", { "class": "error" }, "Last poll failed: " + c.poll_error)); }
      if (c.accounting_error) {
        box.appendChild(el("p", { "class": "error accounting-error" }, "Accounting: " + c.accounting_error));
      }
      // One definition of the slots (dashboards.selectors.queue_slots): the parts add up to the total.
      var t = el("table", { "class": "grid", "id": "queues-" + c.name });
      var h = el("tr");
      ["Queue", "Slots", "In use (tasks placed there)", "Reserved (advance reservations)", "Unavailable", "Free"].forEach(function (x) { h.appendChild(el("th", null, x)); });
      var thead = el("thead"); thead.appendChild(h); t.appendChild(thead);
      var tb = el("tbody");
      (c.slots || []).forEach(function (q) {
        var tr = el("tr", { "data-queue": q.name });
        tr.appendChild(el("td", null, q.name));
        tr.appendChild(el("td", { "class": "num slots-total" }, q.total));
        tr.appendChild(el("td", { "class": "num slots-used" }, q.in_use));
        tr.appendChild(el("td", { "class": "num slots-reserved" }, q.reserved));
        tr.appendChild(el("td", { "class": "num slots-unavailable" }, q.unavailable));
        tr.appendChild(el("td", { "class": "num slots-free" }, q.free));
        tb.appendChild(tr);
      });
      t.appendChild(tb); box.appendChild(t);
      c.queues.forEach(function (q) {  // queue calendars (calendar_conf(5)): state now, next change
        if (!q.calendar_text) { return; }
        box.appendChild(el("p", { "class": "calendar calendar-" + (q.calendar_state || "unknown"), "data-queue": q.name },
          q.calendar_text));
      });
      (c.slots || []).forEach(function (q) {
        var parts = [q.in_use + " in use by tasks placed there"];
        if (q.reserved) { parts.push(q.reserved + " reserved by advance reservations"); }
        var why = q.unavailable_instances.filter(function (i) { return i.slots > 0; }).map(function (i) {
          return i.name + " " + i.meanings.join(", ").split(":")[0] + " (" + i.states + ")";
        });
        if (q.unavailable) { parts.push(q.unavailable + " unavailable" + (why.length ? " (" + why.join("; ") + ")" : "")); }
        parts.push(q.free + " free");
        box.appendChild(el("p", { "class": "slots-line", "data-queue": q.name }, q.name + ": " + q.total + " slots: " + parts.join(", ") + "."));
      });
      if (c.seats) {
        box.appendChild(el("p", { "id": "seats" }, "Model API seats (consumable " + c.seats.resource + ", global): " +
          num(c.seats.used, 0) + " of " + num(c.seats.capacity, 0) + " in use"));
      }
      (c.consumables || []).forEach(function (x) {
        if (c.seats && x.resource === c.seats.resource) { return; }
        box.appendChild(el("p", { "class": "consumable", "data-resource": x.resource }, "Consumable " + x.resource + ": " +
          num(x.used) + " of " + num(x.capacity) + " in use"));
      });
      c.quotas.forEach(function (q) {
        // qquota's usage counts only what the rule's filters match (for slots: tasks placed in them).
        var scope = Object.keys(q.filters || {}).sort().map(function (k) {
          return k.charAt(0) === "x" ? k.slice(1) + " not " + q.filters[k].join(",") : k + " " + q.filters[k].join(",");
        }).join(", ");
        var counted = q.resource === "slots" ? "slots of the tasks placed" : q.resource + " requested by the tasks placed";
        box.appendChild(el("p", { "class": "quota", "data-rule": q.rule }, "Quota " + q.rule + " (resource quota): " +
          q.resource + " " + num(q.used) + " of " + num(q.limit) + " in use, counting the " + counted +
          (scope ? " in " + scope : " anywhere") + "."));
      });
      var nodes = (c.share_tree || []).filter(function (n) { return n.project && !n.user; });
      if (nodes.length) {
        var st = el("table", { "class": "grid share-tree", "id": "share-tree-" + c.name });
        var sh = el("tr");
        ["Share tree: project", "Shares", "Share of the tree", "Target now", "Actual share", "Usage (decayed, weighted cpu-s)", "Jobs"].forEach(function (x) { sh.appendChild(el("th", null, x)); });
        var sthead = el("thead"); sthead.appendChild(sh); st.appendChild(sthead);
        var stb = el("tbody");
        nodes.forEach(function (n) {
          var tr = el("tr", { "data-project": n.project });
          tr.appendChild(el("td", null, n.project));
          tr.appendChild(el("td", { "class": "num" }, num(n.shares)));
          tr.appendChild(el("td", { "class": "num" }, pct(n.total_share)));
          tr.appendChild(el("td", { "class": "num", "title": "0 while the project has no jobs" }, pct(n.long_target_share)));
          tr.appendChild(el("td", { "class": "num" }, pct(n.actual_share)));
          tr.appendChild(el("td", { "class": "num" }, n.usage === null || n.usage === undefined ? "" : Number(n.usage).toFixed(2)));
          tr.appendChild(el("td", { "class": "num" }, num(n.job_count)));
          stb.appendChild(tr);
        });
        st.appendChild(stb); box.appendChild(st);
      }
      if (c.share_tree_error) { box.appendChild(el("p", { "class": "muted" }, "Share tree not available: " + c.share_tree_error)); }
    });
  }

  function render(data) {
    STATES = data.states; ACTIVE = data.active_states || data.states;
    TCO.setTime(document.getElementById("generated-at"), data.generated_at);
    renderClusters(data);
    if (TCO.renderHosts) { TCO.renderHosts(data); }
    var teams = (data.by_team || []).map(function (r) {
      var tr = el("tr", { "data-team": r.project }); tr.appendChild(el("td", null, r.team)); stateCells(tr, r.states, ACTIVE); return tr;
    });
    TCO.fill(document.querySelector("#by-team tbody"), teams.length ? teams : [emptyRow(ACTIVE.length + 1, "no active tasks")]);
    var queues = (data.by_queue || []).map(function (r) {
      var tr = el("tr", { "data-queue": r.queue });
      tr.appendChild(el("td", null, r.cluster)); tr.appendChild(el("td", null, r.queue || "(none yet)"));
      stateCells(tr, r.states, ACTIVE); return tr;
    });
    TCO.fill(document.querySelector("#by-queue tbody"), queues.length ? queues : [emptyRow(ACTIVE.length + 2, "no active tasks")]);
    var rows = data.campaigns.map(function (c) {
      var tr = el("tr", { "data-campaign": c.id });
      var td = el("td"); td.appendChild(el("a", { "href": "/campaigns/" + c.id + "/" }, c.name));
      if (c.urgent) { td.appendChild(el("span", { "class": "badge urgent" }, "urgent")); }
      tr.appendChild(td);
      tr.appendChild(el("td", null, c.team));
      tr.appendChild(el("td", null, c.queue));
      tr.appendChild(el("td", { "class": "num" }, c.job_number === null ? "" : c.job_number));
      tr.appendChild(el("td", { "class": "num", "title": "array tasks " + c.tasks }, c.task_count));
      tr.appendChild(el("td", null, c.status));
      var p = el("td", { "class": "progress-cell" });
      var bar = el("div", { "class": "mini-progress", "title": c.progress_pct + " % ended" });
      var fill = el("div", { "class": "bar" }); fill.style.width = c.progress_pct + "%"; bar.appendChild(fill);
      p.appendChild(bar); tr.appendChild(p);
      stateCells(tr, c.states);
      return tr;
    });
    // Only the states some campaign on this page has get a column: all fourteen do not fit 1280 px.
    var used = {};
    data.campaigns.forEach(function (c) { STATES.forEach(function (s) { if (c.states[s]) { used[s] = true; } }); });
    rows.forEach(function (tr) {
      tr.querySelectorAll("td[data-state]").forEach(function (td) { td.hidden = !used[td.getAttribute("data-state")]; });
    });
    document.querySelectorAll("#campaigns th[data-state]").forEach(function (th) {
      th.hidden = !used[th.getAttribute("data-state")];
    });
    TCO.fill(document.querySelector("#campaigns tbody"), rows);
    document.getElementById("no-campaigns").hidden = rows.length > 0;
    TCO.pager(document.getElementById("campaigns-pager"), data.campaigns_page, function (page) {
      if (live) { live.send({ page: page }); }
    });
    var otherCard = document.getElementById("other-jobs-card");
    if (data.other_jobs) {
      otherCard.hidden = false;
      // None: one word, not header rows over greyed zeros and an empty table.
      var anyOther = Object.keys(data.other_jobs).some(function (s) { return data.other_jobs[s] > 0; });
      ["other-jobs", "other-owners", "other-jobs-each"].forEach(function (id) { document.getElementById(id).hidden = !anyOther; });
      document.getElementById("other-jobs-none").hidden = anyOther;
      var tr = el("tr"); stateCells(tr, data.other_jobs);
      TCO.fill(document.querySelector("#other-jobs tbody"), [tr]);
      // One line per owner; each job under "Each job".
      TCO.fill(document.querySelector("#other-owners tbody"), (data.other_owner_rows || []).map(function (o) {
        var r = el("tr", { "data-owner": o.owner });
        r.appendChild(el("td", null, o.owner || "(unknown)")); r.appendChild(el("td", { "class": "num" }, o.jobs));
        r.appendChild(el("td", { "class": "num" }, o.tasks)); stateCells(r, o.states, ACTIVE); return r;
      }));
      TCO.fill(document.querySelector("#other-job-rows tbody"), (data.other_job_rows || []).map(function (j) {
        var r = el("tr", { "data-job": j.job_number });
        r.appendChild(el("td", { "class": "num" }, j.job_number)); r.appendChild(el("td", null, j.name));
        r.appendChild(el("td", null, j.owner)); r.appendChild(el("td", null, j.project));
        r.appendChild(el("td", { "class": "num" }, j.tasks)); stateCells(r, j.states, ACTIVE); return r;
      }));
      var more = document.getElementById("other-jobs-more");
      more.hidden = !data.other_jobs_more;
      more.textContent = data.other_jobs_more ? "… and " + data.other_jobs_more + " more jobs" : "";
    }
    TCO.fill(document.querySelector("#finished tbody"), data.recent_finished.map(function (t) {
      var tr = el("tr", { "class": "state-" + t.state, "data-task": t.task_id });
      var td = el("td"); td.appendChild(el("a", { "href": "/tasks/" + t.id + "/" }, t.task_id)); tr.appendChild(td);
      tr.appendChild(el("td", null, t.campaign || ""));
      tr.appendChild(el("td", null, t.state));
      tr.appendChild(el("td", null, t.project));
      tr.appendChild(el("td", null, t.host));
      tr.appendChild(el("td", { "class": "num" }, num(t.wallclock_s, 0)));
      tr.appendChild(el("td", { "class": "num" }, num(t.exit_status)));
      tr.appendChild(el("td", { "class": "num" }, num(t.failed_code)));
      tr.appendChild(el("td", null, TCO.time(t.ended_at)));
      return tr;
    }));
  }

  // [start, end] of the samples' times, widened to MIN_SPAN_MS ending at the last one (ms since the epoch).
  var MIN_SPAN_MS = 60000;
  function minuteRange(times) {
    var first = Date.parse(times[0]), last = Date.parse(times[times.length - 1]);
    return last - first >= MIN_SPAN_MS ? [first, last] : [last - MIN_SPAN_MS, last];
  }

  function drawDepth() {
    var d = depth && depth[depthWindow];
    var chart = document.getElementById("depth-chart");
    var empty = !d || !d.t.length;
    document.getElementById("depth-empty").hidden = !empty;
    if (empty || !window.Plotly) { chart.hidden = empty; return; }
    chart.hidden = false;
    var traces = Object.keys(d.queued).sort().map(function (team) {
      return { x: d.t, y: d.queued[team], name: team + " queued", type: "scatter", mode: "lines", stackgroup: "queued" };
    });
    traces.push({ x: d.t, y: d.running, name: "running", type: "scatter", mode: "lines", line: { dash: "dot", color: "#1e7b34" } });
    window.Plotly.react(chart, traces, TCO.themed({
      // The legend above the plot and room below for the date line of the ticks: a legend or a
      // second tick line pushed under a fixed 40 px margin was clipped to a stray letter.
      margin: { l: 50, r: 10, t: 30, b: 10 }, height: 280,
      legend: { orientation: "h", x: 0, y: 1.02, xanchor: "left", yanchor: "bottom" },
      yaxis: { title: { text: "tasks" }, rangemode: "tozero", automargin: true },
      // At least a minute wide: one or two samples a second apart gave sub-second ticks, each
      // labelled with the same second ("16:29:59" four times).
      xaxis: TCO.utcAxis({ range: minuteRange(d.t), tickformatstops: [
        { dtickrange: [null, 60000], value: "%H:%M:%S" }, { dtickrange: [60000, 86400000], value: "%H:%M" }, { dtickrange: [86400000, null], value: "%b %d" }] })
    }), TCO.plotConfig);
  }

  Array.prototype.forEach.call(document.querySelectorAll(".tabs .tab"), function (b) {
    b.addEventListener("click", function () {
      depthWindow = b.getAttribute("data-window");
      Array.prototype.forEach.call(document.querySelectorAll(".tabs .tab"), function (x) { x.classList.toggle("on", x === b); });
      drawDepth();
    });
  });

  render(TCO.json("initial-summary"));
  depth = TCO.json("initial-depth");
  drawDepth();
  live = TCO.connect("/ws/queue/", function (msg) {
    if (msg.kind === "queue.snapshot") { render(msg.data); }
    else if (msg.kind === "queue.depth") { depth = msg.data; drawDepth(); }
  }, TCO.json("initial-live"));
  var initialPage = TCO.json("initial-summary").campaigns_page;
  if (initialPage && initialPage.page > 1) { live.send({ page: initialPage.page }); }
})();
