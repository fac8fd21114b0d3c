// Agent page: one task's facts, pending reasons, stage timeline, model
// requests, policy, logs and scheduler data; updated from pushed snapshots.
(function () {
  "use strict";
  var el = TCO.el, num = TCO.num, secs = TCO.secs;
  var initial = TCO.json("initial-task");

  function kv(tbody, pairs) {
    TCO.fill(tbody, pairs.map(function (p) {
      var tr = el("tr", { "data-key": p[0] });
      tr.appendChild(el("th", null, p[0])); tr.appendChild(el("td", p[2] ? { "class": p[2] } : null, p[1])); return tr;
    }));
  }

  function renderFacts(d) {
    var t = d.task;
    kv(document.querySelector("#facts tbody"), [
      ["state", t.state + (t.state_code ? " (" + t.state_code + ")" : "") + (t.restarted ? " restarted" : "") +
        (t.runner_note ? " — " + t.runner_note : "")],
      ["queue / host", (t.queue || "—") + " / " + (t.host || "—")],
      ["submitted", TCO.time(t.submitted_at)], ["started", TCO.time(t.started_at)], ["ended", TCO.time(t.ended_at)],
      ["wall clock (s)", num(t.wallclock_s)], ["exit status", num(t.exit_status)], ["failed", num(t.failed_code)],
      ["why it failed", t.failure ? t.failure.text + (t.failure.kind === "infrastructure" ?
        " (an infrastructure failure: Retry on the campaign's control page runs it again)" : "") : "—",
        t.failure ? "failure failure-" + t.failure.kind : ""],
      ["tokens", t.tokens.total + " (input " + t.tokens.input_tokens + ", cache read " + t.tokens.cache_read_tokens +
        ", cache write " + (t.tokens.cache_write_5m_tokens + t.tokens.cache_write_1h_tokens) + ", output " + t.tokens.output_tokens + ")"],
      // OCS 9 flexible accounting: the record's token totals against tco's metering (dashboards/ingest.py token_check).
      ["accounting check", t.accounting_check ? t.accounting_check.message : "—",
        t.accounting_check ? (t.accounting_check.status === "differs" ? "error accounting-differs" : "accounting-confirmed") : ""],
      ["cost", TCO.money(t.cost_usd) || "—"], ["verdict", t.verdict || "—"], ["flags", (t.flags || []).join(", ") || "—"],
      ["runner", d.runner ? ("exit " + num(d.runner.exit_status) + (d.runner.signal ? ", signal " + d.runner.signal : "") +
        ((d.runner.flags || []).length ? ", flags " + d.runner.flags.join(", ") : "") + (d.runner.error ? ", error: " + d.runner.error : "")) : "no record yet"]
    ]);
    var card = document.getElementById("pending-card");
    var reasons = d.pending_reasons;
    card.hidden = !reasons;
    if (reasons) {
      TCO.fill(document.getElementById("pending-reasons"), reasons.length ? reasons.map(function (r) {
        return TCO.ticking(el("li", { "title": r.raw }), r.text, r.relative);  // "36 s ago" keeps moving
      }) : [el("li", null, "the scheduler gives no reason (yet)")]);
    }
  }

  // The server's clock minus this browser's, from the newest snapshot: in-progress stages and the
  // elapsed time are drawn up to the server's "now", ticking between snapshots.
  var offsetMs = 0, current = initial;
  function serverNow() { return new Date(Date.now() + offsetMs); }
  function syncClock(d) { if (d.generated_at) { offsetMs = new Date(d.generated_at) - Date.now(); } }

  function duration(s) {
    s = Math.max(0, Math.round(s));
    var h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
    return h ? h + " h " + (m < 10 ? "0" : "") + m + " min" : m ? m + " min " + (r < 10 ? "0" : "") + r + " s" : r + " s";
  }

  function renderProgress(d) {
    var p = d.progress, card = document.getElementById("running-card");
    card.hidden = !p;
    if (!p) { return; }
    var elapsed = (serverNow() - new Date(p.started_at)) / 1000;
    document.getElementById("elapsed").textContent = duration(elapsed);
    var pct = p.expected_s ? Math.min(99, 100 * elapsed / p.expected_s) : null;
    var bar = document.querySelector("#run-progress .bar");
    bar.style.width = (pct === null ? 0 : pct.toFixed(1)) + "%";
    document.getElementById("run-progress").setAttribute("aria-valuenow", pct === null ? 0 : pct.toFixed(0));
    document.getElementById("run-progress-text").textContent = pct === null ? "no expected run time yet" :
      pct.toFixed(0) + " % of the expected " + duration(p.expected_s);
    document.getElementById("run-expected").textContent = p.expected_s ? "Expected run time from " + p.expected_from +
      (p.timeout_s ? "; the agent is stopped after " + duration(p.timeout_s) + "." : ".") : "";
  }

  function renderTimeline(d) {
    var now = serverNow().toISOString();
    TCO.fill(document.querySelector("#timeline tbody"), d.timeline.map(function (s) {
      var tr = el("tr", { "data-stage": s.stage, "class": s.overhead ? "overhead" : "" });
      tr.appendChild(el("td", null, s.label + (s.overhead ? " (overhead)" : "")));
      tr.appendChild(el("td", null, TCO.time(s.start)));
      tr.appendChild(el("td", null, s.end ? TCO.time(s.end) : "in progress"));
      tr.appendChild(el("td", { "class": "num" }, s.end ? secs(s.seconds) :
        secs(Math.max(0, (new Date(now) - new Date(s.start)) / 1000)) + " so far"));
      return tr;
    }));
    if (!window.Plotly) { return; }
    var segs = d.timeline.slice().reverse();
    window.Plotly.react(document.getElementById("timeline-chart"), [{
      type: "bar", orientation: "h",
      y: segs.map(function (s) { return s.label; }),
      base: segs.map(function (s) { return s.start; }),
      x: segs.map(function (s) { return Math.max(0, (new Date(s.end || now)) - (new Date(s.start))); }),
      marker: { color: segs.map(function (s) { return s.overhead ? "#f0b36b" : s.end ? "#8fb0ef" : "#c9d8f7"; }) },
      hovertext: segs.map(function (s) { return s.label + ": " + (s.seconds === null ? "in progress" : secs(s.seconds) + " s"); }),
      hoverinfo: "text"
    }], TCO.themed({ margin: { l: 10, r: 10, t: 10, b: 40 }, height: 60 + 28 * Math.max(segs.length, 1),
      // automargin: the left margin grows to the longest stage label ("running (no runner stage yet)").
      xaxis: TCO.utcAxis(), yaxis: { automargin: true }, showlegend: false }), TCO.plotConfig);
  }

  function renderRequests(d) {
    var r = d.requests;
    document.getElementById("requests-summary").textContent = r.count + " request(s)" +
      (r.count > r.shown ? ", first " + r.shown + " shown" : "") + " · total cost " + (TCO.money(r.totals.cost_usd) || "—");
    TCO.fill(document.querySelector("#requests tbody"), r.rows.map(function (q) {
      var tr = el("tr", { "data-seq": q.seq, "class": q.complete ? "" : "incomplete" });
      tr.appendChild(el("td", { "class": "num" }, q.seq));
      tr.appendChild(el("td", null, TCO.time(q.at)));
      tr.appendChild(el("td", { "class": "path", "title": q.provider }, q.method + " " + q.path));
      tr.appendChild(el("td", { "class": "num" }, q.status));
      tr.appendChild(el("td", { "title": q.requested_model && q.requested_model !== q.model ? "asked for " + q.requested_model : null },
        q.model || q.requested_model));
      tr.appendChild(el("td", { "class": "num" }, [q.input_tokens, q.cache_read_tokens,
        q.cache_write_5m_tokens + q.cache_write_1h_tokens, q.output_tokens].join(" · ")));
      tr.appendChild(el("td", { "class": "num" }, TCO.money(q.cost_usd) || "unpriced"));
      tr.appendChild(el("td", { "class": "num" }, q.latency_ms === null || q.latency_ms === undefined ? "" : num(q.latency_ms, 0) + " ms"));
      tr.appendChild(el("td", null, (q.flags || []).join(", ")));
      return tr;
    }));
  }

  function size(n) {
    if (n === null || n === undefined) { return "size unknown"; }
    return n >= 1048576 ? (n / 1048576).toFixed(1) + " MiB" : n >= 1024 ? (n / 1024).toFixed(1) + " KiB" : n + " bytes";
  }

  function renderLog(id, f) {
    var pre = document.getElementById(id);
    var keepBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.textContent = f.text || "";
    document.getElementById(id + "-info").textContent = f.error ? "(" + f.error + ")" :
      (size(f.size) + (f.truncated ? ", the last " + size(new Blob([f.text || ""]).size) + " shown" : "") + (f.path ? " · " + f.path : ""));
    if (keepBottom) { pre.scrollTop = pre.scrollHeight; }
  }

  function renderOutputs(d) {
    var o = d.outputs;
    document.getElementById("outputs-info").textContent = o.error ? "(" + o.error + ")" : (o.dir || "") + (o.more ? " · " + o.more + " more" : "");
    TCO.fill(document.getElementById("outputs"), o.files.map(function (f) {
      var li = el("li");
      li.appendChild(el("a", { "href": "/tasks/" + d.task.id + "/outputs/" + encodeURIComponent(f.name) }, f.name));
      li.appendChild(document.createTextNode(" (" + f.size + " bytes)"));
      return li;
    }));
  }

  function renderScheduler(d) {
    var box = TCO.clear(document.getElementById("accounting"));
    if (!d.accounting.length) { box.appendChild(el("p", { "class": "muted" }, "no accounting record yet")); }
    (d.accounting_rows || []).forEach(function (rows) {
      var t = el("table", { "class": "grid facts accounting" }), tb = el("tbody");
      rows.forEach(function (p) {
        var tr = el("tr"); tr.appendChild(el("th", null, p[0])); tr.appendChild(el("td", null, p[1])); tb.appendChild(tr);
      });
      t.appendChild(tb); box.appendChild(t);
    });
    var s = d.scheduler, pre = document.getElementById("scheduler-raw");
    if (!s) {
      pre.textContent = ""; document.getElementById("scheduler-info").textContent = "(only while the task is in qstat)";
      return;
    }
    document.getElementById("scheduler-info").textContent = "asked at " + TCO.time(s.fetched_at) + (s.error ? " · " + s.error : "");
    pre.textContent = s.detail ? JSON.stringify(s.detail, null, 1) : "";
  }

  function render(d) {
    current = d; syncClock(d);
    renderFacts(d); renderProgress(d); renderTimeline(d); renderRequests(d);
    document.getElementById("policy").textContent = d.policy.text || "(no policy recorded: the runtime's default applies)";
    document.getElementById("policy-source").textContent = d.policy.source ? "from the " + d.policy.source : "";
    renderLog("stdout", d.stdout); renderLog("stderr", d.stderr); renderOutputs(d); renderScheduler(d);
  }

  // Between snapshots: the elapsed time and the in-progress stage move with the page's clock (clock.js's
  // "tco:tick", every second), and the logs' live tail is read every 3 s while the task is active and
  // "follow" is on.
  document.addEventListener("tco:tick", function () {
    if (current.progress) { renderProgress(current); }
    if (current.timeline.some(function (s) { return !s.end; })) { renderTimeline(current); }
  });
  var follow = document.getElementById("follow-logs"), logsBusy = false;
  setInterval(function () {
    if (!follow.checked || logsBusy || !current.task.active) { return; }
    logsBusy = true;
    fetch("/tasks/" + initial.task.id + "/logs.json", { credentials: "same-origin" }).then(function (r) {
      if (!r.ok) { throw new Error("HTTP " + r.status); }
      return r.json();
    }).then(function (logs) {
      renderLog("stdout", logs.stdout); renderLog("stderr", logs.stderr);
      document.getElementById("logs-status").textContent = "tail read at " + TCO.time(logs.generated_at);
    }).catch(function (e) {
      document.getElementById("logs-status").textContent = "could not read the logs: " + e.message;
    }).then(function () { logsBusy = false; });
  }, 3000);
  render(initial);
  TCO.connect("/ws/tasks/" + initial.task.id + "/", function (msg) {
    if (msg.kind === "task.snapshot") { render(msg.data); }
  });
})();
