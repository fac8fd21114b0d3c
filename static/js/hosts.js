// Queue page: execution hosts (state, why, load, memory, slots, tasks) and,
// at the top of the page, the queue instances in alarm, unknown, disabled or
// error state with the scheduler's reasons. Rendered from each snapshot
// (selectors.cluster_hosts); queue.js calls TCO.renderHosts(data).
(function () {
  "use strict";
  var el = TCO.el, num = TCO.num;

  function gib(bytes) { return bytes === null || bytes === undefined ? "–" : (bytes / 1073741824).toFixed(1) + " GiB"; }

  // A queue instance whose only letter is "a" (a load threshold exceeded) runs its tasks and takes no new
  // work until the load falls: busy, not down (the landing page's hosts tile says the same). It gets an
  // amber card of its own; anything else (unknown, error, disabled, suspend alarm ...) the red one.
  function loadAlarmOnly(p) { return /^a+$/.test(p.states || ""); }

  function problemCard(cls, cluster, heading, problems) {
    var card = el("section", { "class": "card " + cls, "data-cluster": cluster });
    card.appendChild(el("h2", null, heading));
    var ul = el("ul", { "class": "host-problems" });
    problems.forEach(function (p) {
      var li = el("li", { "class": "problem", "data-instance": p.name, "data-states": p.states },
        p.name + " [" + p.states + "]: " + p.meanings.join("; "));
      p.reasons.forEach(function (r) { li.appendChild(el("div", { "class": "muted reason" }, r)); });
      ul.appendChild(li);
    });
    card.appendChild(ul);
    return card;
  }

  function renderAlerts(data) {
    var box = TCO.clear(document.getElementById("host-alerts"));
    data.clusters.forEach(function (c) {
      var problems = c.problems || [];
      var busy = problems.filter(loadAlarmOnly), serious = problems.filter(function (p) { return !loadAlarmOnly(p); });
      var seriousHosts = {}, busyHosts = {};
      serious.forEach(function (p) { seriousHosts[p.host] = true; });
      busy.forEach(function (p) { busyHosts[p.host] = true; });
      // A host closed by its queues' calendar is planned, not trouble (the calendar line says when it opens);
      // one in load alarm alone is busy.
      var troubled = (c.hosts || []).filter(function (h) {
        if (h.state === "up" || h.state === "closed") { return false; }
        return !(h.state === "alarm" && busyHosts[h.name] && !seriousHosts[h.name]);
      });
      if (troubled.length || serious.length) {
        box.appendChild(problemCard("alert", c.name, "Cluster " + c.name + ": " + troubled.length + " host(s) not up, " +
          serious.length + " queue instance(s) in a state", serious));
      }
      if (busy.length) {
        var names = Object.keys(busyHosts).sort();
        box.appendChild(problemCard("busy", c.name, "Cluster " + c.name + ": " + names.join(", ") + " busy: " +
          busy.length + " queue instance(s) in load alarm take no new work until the load falls; their tasks run",
          busy));
      }
    });
  }

  TCO.renderHosts = function (data) {
    renderAlerts(data);
    var box = TCO.clear(document.getElementById("hosts"));
    data.clusters.forEach(function (c) {
      var hosts = c.hosts || [];
      if (!hosts.length) { box.appendChild(el("p", { "class": "muted" }, "Cluster " + c.name + ": no host status yet.")); return; }
      var t = el("table", { "class": "grid hosts", "id": "hosts-" + c.name });
      var h = el("tr");
      ["Host", "State", "Why", "Load", "Memory used / total", "Slots used / total", "Tasks"].forEach(function (x) { h.appendChild(el("th", null, x)); });
      var thead = el("thead"); thead.appendChild(h); t.appendChild(thead);
      var tb = el("tbody");
      hosts.forEach(function (x) {
        var tr = el("tr", { "data-host": x.name, "data-state": x.state, "class": "host-" + x.state });
        tr.appendChild(el("td", null, x.name));
        tr.appendChild(el("td", { "data-col": "state" }, x.state));
        var why = el("td", { "data-col": "why" });
        (x.why || []).forEach(function (w) { why.appendChild(el("div", null, w)); });
        tr.appendChild(why);
        tr.appendChild(el("td", { "class": "num", "data-col": "load" }, x.load_avg === null ? "–" : num(x.load_avg, 2)));
        tr.appendChild(el("td", { "class": "num" }, gib(x.mem_used_bytes) + " / " + gib(x.mem_total_bytes)));
        tr.appendChild(el("td", { "class": "num", "data-col": "slots" }, x.slots_used + " / " + x.slots_total));
        var tasks = el("td", { "data-col": "tasks" });
        var n = (x.tasks && x.tasks.count) || 0;
        tasks.appendChild(el("span", { "class": "num" }, n + (n ? ": " : "")));
        ((x.tasks && x.tasks.shown) || []).forEach(function (k, i) {
          if (i) { tasks.appendChild(document.createTextNode(", ")); }
          tasks.appendChild(el("a", { "href": "/tasks/" + k.id + "/", "class": "state-" + k.state, "title": k.state }, k.task_id));
        });
        if (x.tasks && n > x.tasks.shown.length) { tasks.appendChild(document.createTextNode(" …")); }
        tr.appendChild(tasks);
        tb.appendChild(tr);
      });
      t.appendChild(tb); box.appendChild(t);
    });
  };
})();
