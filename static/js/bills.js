// The bill's charts, drawn with the Plotly bundled in the plotly package (served by tco: offline).
// Spend per period stacked by the chosen grouping; each budget's cumulative spend against its
// amount, with the projection to the period's end. Unpriced usage is never drawn as $0: its
// periods carry a marker and the hover says how many tasks are unpriced.
(function () {
  "use strict";
  if (!window.Plotly) return;
  const dark = window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches;
  const layoutBase = {
    margin: {l: 60, r: 20, t: 30, b: 40}, barmode: "stack", hovermode: "x unified",
    legend: {orientation: "h", y: -0.2},
    paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
    font: {color: dark ? "#ddd" : "#222"},
    yaxis: {title: {text: "USD"}, tickprefix: "$", rangemode: "tozero"},
  };
  const config = {displaylogo: false, responsive: true};

  // The time zone a chart's days are in (its data-zone: the bill's and the budgets' cluster zone).
  function zone(target) { return target.getAttribute("data-zone") || "the cluster's time zone"; }

  function read(id) {
    const el = document.getElementById(id);
    return el ? JSON.parse(el.textContent) : null;
  }

  const chart = read("bill-chart-data");
  const target = document.getElementById("bill-chart");
  if (chart && target && chart.periods.length) {
    const traces = chart.series.map(function (s) {
      return {
        type: "bar", name: s.label, x: chart.periods, y: s.cost_usd,
        marker: s.launched_by_tco ? {} : {pattern: {shape: "/"}, color: "#999"},
        customdata: s.unpriced_tasks,
        hovertemplate: "%{y:$.4f}" + (s.unpriced_tasks.some(Boolean) ? " + %{customdata} unpriced task(s)" : "") +
          "<extra>" + s.label.replace(/</g, "&lt;") + "</extra>",
      };
    });
    const unpriced = chart.periods.map(function (_, i) {
      return chart.series.reduce(function (n, s) { return n + s.unpriced_tasks[i]; }, 0);
    });
    if (unpriced.some(Boolean)) {
      traces.push({
        type: "scatter", mode: "markers+text", name: "unpriced tasks (cost unknown)",
        x: chart.periods.filter(function (_, i) { return unpriced[i]; }),
        y: chart.periods.map(function (_, i) {
          return chart.series.reduce(function (t, s) { return t + s.cost_usd[i]; }, 0);
        }).filter(function (_, i) { return unpriced[i]; }),
        text: unpriced.filter(Boolean).map(function (n) { return "+" + n + " unpriced"; }),
        textposition: "top center", marker: {symbol: "triangle-down", size: 10, color: "#c77700"},
        hoverinfo: "skip",
      });
    }
    // Periods are categories (a day, an ISO week's Monday, a month's first day): one bar each.
    // The periods are cut in the cluster's time zone (dashboards.billing.periods): the axis names it.
    Plotly.newPlot(target, traces, Object.assign({}, layoutBase, {xaxis: {type: "category", automargin: true,
                                                                          title: {text: "period (" + zone(target) + ")"}}}),
                   config);
  } else if (target) {
    target.textContent = "Nothing to draw for these periods.";
  }

  const burns = read("burn-chart-data");
  const burnTarget = document.getElementById("burn-chart");
  if (burns && burnTarget && burns.length) {
    const traces = [];
    burns.forEach(function (b) {
      const name = b.team + " " + b.period;
      traces.push({type: "scatter", mode: "lines+markers", name: name + " spent", x: b.days, y: b.cumulative_usd});
      const lastDay = b.days[b.days.length - 1];
      const lastValue = b.cumulative_usd[b.cumulative_usd.length - 1] || 0;
      traces.push({type: "scatter", mode: "lines", name: name + " projected", x: [lastDay, b.end_day],
                   y: [lastValue, b.projected_usd], line: {dash: "dot"}});
      traces.push({type: "scatter", mode: "lines", name: name + " budget", x: [b.days[0], b.end_day],
                   y: [b.amount_usd, b.amount_usd], line: {dash: "dash", color: "#c62828"}});
    });
    Plotly.newPlot(burnTarget, traces, Object.assign({}, layoutBase, {barmode: undefined,
                   xaxis: {type: "date", automargin: true, title: {text: "day (" + zone(burnTarget) + ")"}}}), config);
  }
})();
