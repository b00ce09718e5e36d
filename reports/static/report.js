/* transformer-advisor report: draws the chart specs of the view model with Chart.js and makes
 * tables sortable. Everything it reads is in the page (#report-data); it loads nothing.
 * window.advisorReport records which charts were drawn and any error, for the browser test. */
(function () {
  "use strict";
  var state = { drawn: [], failed: [], done: false };
  window.advisorReport = state;

  var COLORS = {
    chosen: "#d62728", baseline: "#7f7f7f", validated: "#ff7f0e", measured: "#2ca02c",
    feasible: "#1f77b4", infeasible: "#c7c7c7", frontier: "#9467bd", budget: "#d62728",
    predicted: "#9467bd", train: "#1f77b4", eval: "#ff7f0e", lr: "#17becf", mfu: "#d62728",
    gemm: "#2ca02c",
    "mem-parameters": "#4e79a7", "mem-gradients": "#f28e2b", "mem-optimizer-state": "#e15759",
    "mem-activations": "#76b7b2", "mem-temporaries": "#59a14f", "mem-overhead": "#bab0ac",
    "comm-all_reduce": "#1f77b4", "comm-all_gather": "#ff7f0e",
    "comm-reduce_scatter": "#2ca02c", "comm-broadcast": "#9467bd"
  };
  var FALLBACK = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2"];

  function color(series, index) {
    return COLORS[series.role] || FALLBACK[index % FALLBACK.length];
  }

  function fmtNumber(v) {
    if (v === null || v === undefined || isNaN(v)) { return "—"; }
    var a = Math.abs(v);
    if (a !== 0 && (a >= 1e6 || a < 1e-3)) { return v.toExponential(2); }
    return v.toLocaleString(undefined, { maximumSignificantDigits: 4 });
  }

  function tooltipLabel(ctx) {
    var s = ctx.dataset.advisorSeries;
    var hover = s && s.hover ? s.hover[ctx.dataIndex] : "";
    var y = ctx.parsed && ctx.parsed.y;
    return ctx.dataset.label + ": " + (hover || fmtNumber(y));
  }

  function xyDataset(s, i, spec) {
    var c = color(s, i);
    var ds = {
      label: s.label,
      data: s.points.map(function (p) { return { x: p[0], y: p[1] }; }),
      borderColor: c,
      backgroundColor: c,
      advisorSeries: s
    };
    if (spec.kind === "scatter") {
      ds.type = "scatter";
      ds.pointRadius = s.role === "chosen" ? 8 : s.role === "baseline" ? 7 : 5;
      ds.pointStyle = { chosen: "star", baseline: "rectRot", validated: "circle",
                        measured: "triangle", infeasible: "crossRot" }[s.role] || "circle";
      if (s.role === "validated") { ds.backgroundColor = "rgba(0,0,0,0)"; ds.borderWidth = 2; }
      if (s.role === "frontier") {
        ds.type = "line"; ds.showLine = true; ds.pointRadius = 0; ds.borderDash = [6, 4];
        ds.borderWidth = 1.5; ds.order = 10;
      }
    } else {
      ds.type = "line";
      ds.pointRadius = s.points.length > 60 ? 0 : 2;
      ds.borderWidth = 1.5;
      if (s.role === "eval") { ds.pointRadius = 3; }
      if (s.role === "predicted") { ds.borderDash = [6, 4]; ds.pointRadius = 0; }
    }
    return ds;
  }

  function verticalLine(s, datasets) {
    var ys = [];
    datasets.forEach(function (d) { d.data.forEach(function (p) { if (p.y !== null) { ys.push(p.y); } }); });
    var lo = 0, hi = ys.length ? Math.max.apply(null, ys) * 1.05 : 1;
    var x = s.points[0][0];
    return {
      type: "line", label: s.label, showLine: true, pointRadius: 0, borderDash: [4, 4],
      borderColor: COLORS.budget, backgroundColor: COLORS.budget, borderWidth: 1.5,
      data: [{ x: x, y: lo }, { x: x, y: hi }], advisorSeries: { hover: s.hover.concat(s.hover) }
    };
  }

  function fmtBytes(v) {
    var units = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (v >= 10 || v === Math.round(v) ? Math.round(v) : v.toFixed(1)) + " " + units[i];
  }

  function byteAxis(axis) {
    // Ticks at powers of four (1 KiB, 4 KiB, 16 KiB ...): message sizes double per sample.
    axis.afterBuildTicks = function (scale) {
      var ticks = [], v = Math.pow(2, Math.floor(Math.log2(Math.max(scale.min, 1))));
      if (Math.log2(v) % 2) { v *= 2; }
      for (; v <= scale.max * 1.0001; v *= 4) { if (v >= scale.min * 0.9999) { ticks.push({ value: v }); } }
      if (ticks.length) { scale.ticks = ticks; }
    };
    axis.ticks = { callback: function (v) { return fmtBytes(v); }, autoSkip: false };
  }

  function barDataset(s, i) {
    var c = color(s, i);
    var ds = {
      label: s.label, data: s.values, backgroundColor: c, borderColor: c, advisorSeries: s
    };
    if (s.kind === "line") {
      ds.type = "line"; ds.borderDash = [6, 4]; ds.pointRadius = 0; ds.borderWidth = 2;
      ds.fill = false; ds.order = -1;
    } else if (s.kind === "point") {
      ds.type = "line"; ds.showLine = false; ds.pointStyle = "crossRot"; ds.pointRadius = 9;
      ds.pointBorderWidth = 3; ds.borderColor = "#000"; ds.backgroundColor = "#000"; ds.order = -2;
    } else {
      ds.type = "bar";
      if (s.stack) { ds.stack = s.stack; }
    }
    return ds;
  }

  function config(spec) {
    var datasets;
    var scales = {};
    if (spec.kind === "bar") {
      datasets = spec.series.map(barDataset);
      scales.x = { stacked: spec.stacked, title: { display: true, text: spec.x_label } };
      scales.y = { stacked: spec.stacked, title: { display: true, text: spec.y_label } };
    } else {
      var plain = spec.series.filter(function (s) { return s.kind !== "vline"; });
      datasets = plain.map(function (s, i) { return xyDataset(s, i, spec); });
      spec.series.filter(function (s) { return s.kind === "vline"; }).forEach(function (s) {
        datasets.push(verticalLine(s, datasets));
      });
      scales.x = { type: spec.x_log ? "logarithmic" : "linear",
                   title: { display: true, text: spec.x_label } };
      if (spec.x_bytes) { byteAxis(scales.x); }
      scales.y = { type: spec.y_log ? "logarithmic" : "linear",
                   title: { display: true, text: spec.y_label } };
    }
    if (spec.y_min !== null && !spec.y_log) { scales.y.min = spec.y_min; }
    if (spec.y_max !== null) { scales.y.max = spec.y_max; }
    var plugins = {
      legend: { position: "bottom", labels: { boxWidth: 12, usePointStyle: spec.kind === "scatter" } },
      tooltip: { callbacks: { label: tooltipLabel } }
    };
    if (spec.zoom && window.ChartZoom) {
      plugins.zoom = { zoom: { drag: { enabled: true }, mode: spec.kind === "scatter" ? "xy" : "x" } };
    }
    return {
      type: spec.kind === "bar" ? "bar" : spec.kind === "scatter" ? "scatter" : "line",
      data: { labels: spec.kind === "bar" ? spec.categories : undefined, datasets: datasets },
      options: {
        animation: false, responsive: true, maintainAspectRatio: false, parsing: spec.kind === "bar",
        interaction: spec.kind === "line" ? { mode: "nearest", axis: "x", intersect: false }
                                          : { mode: "nearest", intersect: true },
        scales: scales, plugins: plugins
      }
    };
  }

  function drawCharts(data) {
    if (!window.Chart) { throw new Error("Chart.js did not load"); }
    if (window.ChartZoom) { window.Chart.register(window.ChartZoom); }
    data.charts.forEach(function (spec) {
      var canvas = document.getElementById("chart-" + spec.id);
      if (!canvas) { state.failed.push(spec.id + ": no canvas"); return; }
      try {
        var chart = new window.Chart(canvas, config(spec));
        canvas.addEventListener("dblclick", function () {
          if (chart.resetZoom) { chart.resetZoom(); }
        });
        canvas.setAttribute("data-drawn", "true");
        state.drawn.push(spec.id);
      } catch (err) {
        state.failed.push(spec.id + ": " + err);
        console.error("chart " + spec.id + " failed:", err);
      }
    });
  }

  function sortable(table) {
    var headers = table.querySelectorAll("thead th");
    headers.forEach(function (th, column) {
      th.addEventListener("click", function () {
        var ascending = th.getAttribute("aria-sort") !== "ascending";
        headers.forEach(function (h) { h.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = a.cells[column].getAttribute("data-sort");
          var y = b.cells[column].getAttribute("data-sort");
          var nx = parseFloat(x), ny = parseFloat(y);
          var cmp;
          if (x === null || x === "") { cmp = (y === null || y === "") ? 0 : 1; return cmp; }
          if (y === null || y === "") { return -1; }
          cmp = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
          return ascending ? cmp : -cmp;
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  }

  function main() {
    try {
      document.querySelectorAll("table.sortable").forEach(sortable);
      var node = document.getElementById("report-data");
      drawCharts(JSON.parse(node.textContent));
    } catch (err) {
      state.failed.push("report: " + err);
      console.error(err);
    }
    state.done = true;
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", main);
  } else {
    main();
  }
})();
