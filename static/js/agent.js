// Agent page: one task's facts, pending reasons, stage timeline, model
// requests, policy, logs and scheduler data; updated from pushed snapshots.
(function () {
  "use strict";
  var el = TCO.el, num = TCO.num, secs = TCO.secs;
  var initial = TCO.json("initial-task");

  function kv(tbody, pairs) {
    TCO.fill(tbody, pairs.map(function (p) {
      var tr = el("tr", { "data-key": p[0] });
      tr.appendChild(el("th", null, p[0])); tr.appendChild(el("td", null, p[1])); return tr;
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
      ["tokens", t.tokens.total + " (input " + t.tokens.input_tokens + ", cache read " + t.tokens.cache_read_tokens +
        ", cache write " + (t.tokens.cache_write_5m_tokens + t.tokens.cache_write_1h_tokens) + ", output " + t.tokens.output_tokens + ")"],
      ["cost", TCO.money(t.cost_usd) || "—"], ["verdict", t.verdict || "—"], ["flags", (t.flags || []).join(", ") || "—"],
      ["runner", d.runner ? ("exit " + num(d.runner.exit_status) + (d.runner.signal ? ", signal " + d.runner.signal : "") +
        ((d.runner.flags || []).length ? ", flags " + d.runner.flags.join(", ") : "") + (d.runner.error ? ", error: " + d.runner.error : "")) : "no record yet"]
    ]);
    var card = document.getElementById("pending-card");
    var reasons = d.pending_reasons;
    card.hidden = !reasons;
    if (reasons) {
      TCO.fill(document.getElementById("pending-reasons"), reasons.length ? reasons.map(function (r) {
        var li = el("li", { "title": r.raw }, r.text); return li;
      }) : [el("li", null, "the scheduler gives no reason (yet)")]);
    }
  }

  function renderTimeline(d) {
    var now = d.generated_at;
    TCO.fill(document.querySelector("#timeline tbody"), d.timeline.map(function (s) {
      var tr = el("tr", { "data-stage": s.stage, "class": s.overhead ? "overhead" : "" });
      tr.appendChild(el("td", null, s.label + (s.overhead ? " (overhead)" : "")));
      tr.appendChild(el("td", null, TCO.time(s.start)));
      tr.appendChild(el("td", null, s.end ? TCO.time(s.end) : "in progress"));
      tr.appendChild(el("td", { "class": "num" }, secs(s.seconds)));
      return tr;
    }));
    if (!window.Plotly) { return; }
    var segs = d.timeline.slice().reverse();
    window.Plotly.react(document.getElementById("timeline-chart"), [{
      type: "bar", orientation: "h",
      y: segs.map(function (s) { return s.label; }),
      base: segs.map(function (s) { return s.start; }),
      x: segs.map(function (s) { return (new Date(s.end || now)) - (new Date(s.start)); }),
      marker: { color: segs.map(function (s) { return s.overhead ? "#f0b36b" : s.end ? "#8fb0ef" : "#c9d8f7"; }) },
      hovertext: segs.map(function (s) { return s.label + ": " + (s.seconds === null ? "in progress" : secs(s.seconds) + " s"); }),
      hoverinfo: "text"
    }], { margin: { l: 140, r: 10, t: 10, b: 40 }, height: 60 + 28 * Math.max(segs.length, 1),
      xaxis: { type: "date" }, showlegend: false }, TCO.plotConfig);
  }

  function renderRequests(d) {
    var r = d.requests;
    document.getElementById("requests-summary").textContent = r.count + " request(s)" +
      (r.count > r.shown ? ", first " + r.shown + " shown" : "") + " · total cost " + (TCO.money(r.totals.cost_usd) || "—");
    TCO.fill(document.querySelector("#requests tbody"), r.rows.map(function (q) {
      var tr = el("tr", { "data-seq": q.seq, "class": q.complete ? "" : "incomplete" });
      [q.seq, TCO.time(q.at), q.provider, q.method + " " + q.path, q.status,
       q.model || q.requested_model, q.input_tokens, q.cache_read_tokens, q.cache_write_5m_tokens,
       q.cache_write_1h_tokens, q.output_tokens, TCO.money(q.cost_usd), num(q.latency_ms, 0), (q.flags || []).join(", ")
      ].forEach(function (v, i) { tr.appendChild(el("td", { "class": (i >= 6 && i <= 12) || i === 0 || i === 4 ? "num" : "" }, v)); });
      return tr;
    }));
  }

  function renderLog(id, f) {
    var pre = document.getElementById(id);
    var keepBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.textContent = f.text || "";
    document.getElementById(id + "-info").textContent = f.error ? "(" + f.error + ")" :
      (f.size + " bytes" + (f.truncated ? ", last " + (f.text || "").length + " characters shown" : "") + (f.path ? " · " + f.path : ""));
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
    d.accounting.forEach(function (a) {
      var t = el("table", { "class": "grid facts accounting" }), tb = el("tbody");
      Object.keys(a).forEach(function (k) {
        if (k === "usage" && a[k] && !Object.keys(a[k]).length) { return; }
        var tr = el("tr"); tr.appendChild(el("th", null, k));
        tr.appendChild(el("td", null, typeof a[k] === "object" && a[k] !== null ? JSON.stringify(a[k]) : a[k])); tb.appendChild(tr);
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
    renderFacts(d); renderTimeline(d); renderRequests(d);
    document.getElementById("policy").textContent = d.policy.text || "(no policy recorded: the runtime's default applies)";
    document.getElementById("policy-source").textContent = d.policy.source ? "from the " + d.policy.source : "";
    renderLog("stdout", d.stdout); renderLog("stderr", d.stderr); renderOutputs(d); renderScheduler(d);
  }

  render(initial);
  TCO.connect("/ws/tasks/" + initial.task.id + "/", function (msg) {
    if (msg.kind === "task.snapshot") { render(msg.data); }
  });
})();
