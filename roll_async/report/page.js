// Renders the roll-async report from the JSON embedded in the page. Plain DOM + SVG, no libraries, no network.
(function () {
  "use strict";
  var SVG_NS = "http://www.w3.org/2000/svg";
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var VERSION_COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#e15759", "#bab0ac", "#ff9da7"];
  // The env's own named spans (workspace start, commands, verifier): one colour per name, in order of appearance.
  var ENV_SPAN_COLORS = ["#e6a01e", "#17becf", "#e377c2", "#bcbd22", "#8c564b", "#7f7f7f"];
  var COLORS = { waiting: "#e9ecf1", reset: "#c9ced8", env_step: "#3b4252", reward: "#2ca02c", queued: "#9aa5b8", env_error: "#d62728", dropped: "#ff7f0e", straggler: "#8e24aa", trainer: "#c0504d" };

  function versionColor(v) {
    if (v === null || v === undefined || v < 0) { return "#888888"; }
    return VERSION_COLORS[v % VERSION_COLORS.length];
  }
  function svg(tag, attrs, parent) {
    var el = document.createElementNS(SVG_NS, tag);
    Object.keys(attrs || {}).forEach(function (k) { el.setAttribute(k, attrs[k]); });
    if (parent) { parent.appendChild(el); }
    return el;
  }
  function html(tag, attrs, text, parent) {
    var el = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { el.setAttribute(k, attrs[k]); });
    if (text !== undefined && text !== null) { el.textContent = text; }
    if (parent) { parent.appendChild(el); }
    return el;
  }
  function fmt(x, digits) {
    if (x === null || x === undefined || typeof x !== "number" || !isFinite(x)) { return "–"; }
    return x.toFixed(digits === undefined ? 2 : digits);
  }
  function title(el, text) { svg("title", {}, el).textContent = text; }
  function isDropped(fate) { return fate !== "served" && fate !== "env_error"; }

  // -- summary -----------------------------------------------------------------------------
  function renderSummary() {
    var box = document.getElementById("summary");
    var c = data.counts;
    var items = [["run", data.run_dir], ["kind", data.kind + (data.mode ? " (" + data.mode + ")" : "")],
      ["env instances", String(data.env_ids.length)], ["served episodes", String(c.served || 0)]];
    Object.keys(c).forEach(function (k) { if (k !== "served") { items.push([k.replace(/_/g, " "), String(c[k])]); } });
    items.push(["median episode", fmt(data.median_episode_s, 2) + " s"]);
    items.forEach(function (kv) { var s = html("span", {}, null, box); html("b", {}, kv[0] + ": ", s); s.appendChild(document.createTextNode(kv[1])); });
  }

  // -- timeline ----------------------------------------------------------------------------
  function renderTimeline() {
    var episodes = data.episodes;
    var envIds = data.env_ids;
    var rowIndex = {};
    envIds.forEach(function (id, i) { rowIndex[id] = i; });
    var tMax = 0;
    var versions = {};
    data.train_spans.forEach(function (s) { if (s.end > tMax) { tMax = s.end; } });
    episodes.forEach(function (e) {
      [e.end, e.served].forEach(function (t) { if (t !== null && t > tMax) { tMax = t; } });
      e.turns.forEach(function (t) { if (t.v !== null && t.v !== undefined) { versions[t.v] = true; } });
    });
    if (tMax <= 0) { tMax = 1; }
    var longest = 0;
    envIds.forEach(function (id) { longest = Math.max(longest, ("env " + id + " " + (data.env_tags[String(id)] || "")).length); });
    var labelW = 16 + 7 * longest, rowH = envIds.length > 48 ? 10 : 14, lane = 3, gap = envIds.length > 48 ? 3 : 5;
    var trainerRow = data.train_spans.length > 0, axisY = 16, trainerY = 24;
    var top = trainerY + (trainerRow ? rowH + 8 : 2);
    var box = document.getElementById("timeline-box");
    var width = Math.max(900, (box.clientWidth || 1200) - 4);
    var plotW = width - labelW - 20;
    var height = top + envIds.length * (rowH + lane + gap) + 10;
    var root = document.getElementById("timeline");
    root.setAttribute("width", width);
    root.setAttribute("height", height);
    root.setAttribute("data-rows", String(envIds.length));
    function x(t) { return labelW + (t / tMax) * plotW; }
    function y(env) { return top + rowIndex[env] * (rowH + lane + gap); }

    var axis = svg("g", { "class": "axis" }, root);
    var step = niceStep(tMax / 10);
    for (var t = 0; t <= tMax + 1e-9; t += step) {
      svg("line", { x1: x(t), x2: x(t), y1: axisY + 4, y2: height, "class": "grid" }, axis);
      svg("text", { x: x(t), y: axisY, "text-anchor": "middle" }, axis).textContent = fmt(t, step < 1 ? 1 : 0) + "s";
    }
    if (trainerRow) {
      var tg = svg("g", { "class": "trainer-row" }, root);
      svg("text", { x: 4, y: trainerY + rowH - 1 }, tg).textContent = "trainer";
      data.train_spans.forEach(function (s) {
        var r = svg("rect", { x: x(s.start), y: trainerY, width: Math.max(1, x(s.end) - x(s.start)), height: rowH, fill: COLORS.trainer, "class": "span-train" }, tg);
        title(r, "train step " + s.step + ": " + fmt(s.end - s.start) + " s");
      });
    }
    // A game's trained seats are trajectories of one env: each seat gets its share of the env's row.
    function seatOf(e) { var m = /^seat(\d+)$/.exec(e.role || ""); return m ? parseInt(m[1], 10) : null; }
    var seatsPerEnv = {};
    episodes.forEach(function (e) { var s = seatOf(e); if (s !== null) { seatsPerEnv[e.env_id] = Math.max(seatsPerEnv[e.env_id] || 1, s + 1); } });
    var rows = {};
    envIds.forEach(function (id) {
      var g = svg("g", { "class": "env-row", "data-env": String(id) }, root);
      var label = svg("text", { x: 4, y: y(id) + rowH - 1 }, g);
      label.textContent = "env " + id + " " + (data.env_tags[String(id)] || "");
      rows[id] = g;
    });
    var hasReward = false;
    var envSpanColors = {}, envSpanNames = [];
    function envSpanColor(name) {
      if (!(name in envSpanColors)) { envSpanColors[name] = ENV_SPAN_COLORS[envSpanNames.length % ENV_SPAN_COLORS.length]; envSpanNames.push(name); }
      return envSpanColors[name];
    }
    episodes.forEach(function (e) {
      var g = rows[e.env_id];
      if (!g || e.start === null) { return; }
      var seat = seatOf(e), h = seat === null ? rowH : rowH / (seatsPerEnv[e.env_id] || 1);
      var y0 = y(e.env_id) + (seat === null ? 0 : seat * h);
      var info = e.traj_id + (e.role ? " " + e.role : "") + " (" + e.fate + ")\nreward " + fmt(e.reward) + ", stop " + e.stop_reason +
        "\ncreated step " + e.created_step + (e.served_step !== null && e.served_step !== undefined ? ", served step " + e.served_step : "") +
        (e.error ? "\nerror: " + e.error : "");
      if (e.requested !== null && e.start - e.requested > 0) {
        var w = svg("rect", { x: x(e.requested), y: y0, width: Math.max(0.5, x(e.start) - x(e.requested)), height: h, fill: COLORS.waiting, "class": "span-waiting" }, g);
        title(w, "waiting for an episode " + fmt(e.start - e.requested) + " s");
      }
      var firstGen = e.turns.length && e.turns[0].gs !== null ? e.turns[0].gs : e.end;
      if (firstGen !== null && firstGen > e.start) {
        var r = svg("rect", { x: x(e.start), y: y0, width: Math.max(0.5, x(firstGen) - x(e.start)), height: h, fill: COLORS.reset, "class": "span-reset" }, g);
        title(r, "env build/reset " + fmt(firstGen - e.start) + " s\n" + info);
      }
      e.turns.forEach(function (t, i) {
        if (t.gs !== null && t.gf !== null) {
          var gr = svg("rect", { x: x(t.gs), y: y0, width: Math.max(0.8, x(t.gf) - x(t.gs)), height: h, fill: versionColor(t.v), "class": "span-generate" }, g);
          title(gr, "generate turn " + i + ": " + fmt(t.gf - t.gs) + " s, " + t.n + " tokens, weight version " + t.v + "\n" + info);
        }
        if (t.es !== null && t.ef !== null) {
          var er = svg("rect", { x: x(t.es), y: y0 + h * 0.2, width: Math.max(0.8, x(t.ef) - x(t.es)), height: h * 0.6, fill: COLORS.env_step, "class": "span-env-step" }, g);
          title(er, "env step turn " + i + ": " + fmt(t.ef - t.es, 3) + " s\n" + info);
        }
      });
      // The env's own spans, a strip through the middle of the reset and env step spans they ran in.
      (e.env_spans || []).forEach(function (sp) {
        if (sp.s === null || sp.f === null) { return; }
        var name = String(sp.name).replace(/[^A-Za-z0-9_-]/g, "_");
        var es = svg("rect", { x: x(sp.s), y: y0 + h * 0.35, width: Math.max(0.8, x(sp.f) - x(sp.s)), height: h * 0.3, fill: envSpanColor(sp.name),
          "class": "env-span env-span-" + name, "data-name": sp.name }, g);
        title(es, sp.name + (sp.turn >= 0 ? " (turn " + sp.turn + ")" : " (reset)") + ": " + fmt(sp.f - sp.s, 3) + " s\n" + info);
      });
      // Scored per turn (reward.per_turn): a thin strip per turn along the row's foot; it overlaps the next turns.
      e.turns.forEach(function (t, i) {
        if (t.rs === null || t.rs === undefined || t.rf === null || t.rf === undefined) { return; }
        var tr = svg("rect", { x: x(t.rs), y: y0 + h * 0.7, width: Math.max(0.8, x(t.rf) - x(t.rs)), height: h * 0.3, fill: COLORS.reward, "class": "span-reward span-reward-turn" }, g);
        title(tr, "reward model turn " + i + ": " + fmt(t.rf - t.rs, 3) + " s\n" + info);
        hasReward = true;
      });
      if (e.rs !== null && e.rs !== undefined && e.rf !== null && e.rf !== undefined) {
        var rr = svg("rect", { x: x(e.rs), y: y0 + h * 0.2, width: Math.max(0.8, x(e.rf) - x(e.rs)), height: h * 0.6, fill: COLORS.reward, "class": "span-reward" }, g);
        title(rr, "reward model " + fmt(e.rf - e.rs, 3) + " s\n" + info);
        hasReward = true;
      }
      if (e.served !== null && e.end !== null && e.served > e.end) {
        var q = svg("rect", { x: x(e.end), y: y(e.env_id) + rowH + 1, width: Math.max(0.5, x(e.served) - x(e.end)), height: lane - 1, fill: COLORS.queued, "class": "span-queued" }, g);
        title(q, "queued for the trainer " + fmt(e.served - e.end) + " s\n" + info);
      }
      if (e.end !== null && (e.fate !== "served" || e.straggler)) {
        var color = e.fate === "env_error" ? COLORS.env_error : (isDropped(e.fate) ? COLORS.dropped : COLORS.straggler);
        var outline = svg("rect", { x: x(e.start), y: y0 - 1, width: Math.max(1, x(e.end) - x(e.start)), height: h + 2, fill: "none", stroke: color,
          "stroke-width": 1.5, "stroke-dasharray": e.fate === "served" ? "none" : "3,2", "class": "episode-mark mark-" + (e.fate === "served" ? "straggler" : e.fate) }, g);
        title(outline, (e.fate === "served" ? "straggler: " : "") + info);
        var mx = x(e.end);
        var marker = svg("path", { d: "M" + (mx - 4) + "," + (y0 - 5) + " L" + (mx + 4) + "," + (y0 - 5) + " L" + mx + "," + (y0 + 1) + " Z", fill: color }, g);
        title(marker, info);
      }
    });
    var legend = document.getElementById("timeline-legend");
    function item(color, text, border) {
      var s = html("span", {}, null, legend);
      var i = html("i", { style: "background:" + color + (border ? ";border:1.5px dashed " + border + ";background:none" : "") }, null, s);
      s.appendChild(document.createTextNode(text));
      return i;
    }
    Object.keys(versions).map(Number).sort(function (a, b) { return a - b; }).forEach(function (v) { item(versionColor(v), "generate, weight version " + v); });
    if (data.train_spans.length) { item(COLORS.trainer, "train step (trainer row)"); }
    item(COLORS.env_step, "env step");
    envSpanNames.forEach(function (name) { item(envSpanColor(name), "env: " + name).setAttribute("data-env-span", name); });
    if (hasReward) { item(COLORS.reward, "reward model (judge / RM)"); }
    item(COLORS.reset, "env build/reset");
    item(COLORS.waiting, "waiting for an episode");
    item(COLORS.queued, "queued for the trainer");
    item("none", "straggler (≥ 2× the median episode time of its step)", COLORS.straggler);
    item("none", "env error", COLORS.env_error);
    item("none", "dropped (stale, filtered, late)", COLORS.dropped);
  }
  function niceStep(raw) {
    if (!(raw > 0)) { return 1; }
    var p = Math.pow(10, Math.floor(Math.log10(raw)));
    var m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
  }

  // -- charts ------------------------------------------------------------------------------
  function lineChart(parent, spec) {
    var W = 420, H = 230, L = 56, R = 12, T = 26, B = 40;
    var root = svg("svg", { width: W, height: H, "class": "chart", "data-chart": spec.title }, parent);
    svg("text", { x: L, y: 16, "class": "title" }, root).textContent = spec.title;
    var xs = [], ys = [];
    spec.series.forEach(function (s) { s.points.forEach(function (p) { if (p[1] !== null) { xs.push(p[0]); ys.push(p[1]); } }); });
    if (!xs.length) { return; }
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    var y0 = Math.min.apply(null, ys), y1 = Math.max.apply(null, ys);
    if (x1 === x0) { x1 = x0 + 1; }
    if (y1 === y0) { y1 = y0 + 1; y0 = y0 - 1; }
    function px(v) { return L + (v - x0) / (x1 - x0) * (W - L - R); }
    function py(v) { return H - B - (v - y0) / (y1 - y0) * (H - T - B); }
    svg("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, stroke: "#9aa3b2" }, root);
    svg("line", { x1: L, x2: L, y1: T, y2: H - B, stroke: "#9aa3b2" }, root);
    [y0, (y0 + y1) / 2, y1].forEach(function (v) {
      svg("text", { x: L - 4, y: py(v) + 4, "text-anchor": "end" }, root).textContent = Math.abs(v) >= 100 ? fmt(v, 0) : fmt(v, 3);
    });
    [x0, x1].forEach(function (v) { svg("text", { x: px(v), y: H - B + 14, "text-anchor": "middle" }, root).textContent = String(v); });
    svg("text", { x: (L + W - R) / 2, y: H - B + 28, "text-anchor": "middle" }, root).textContent = "step";
    spec.series.forEach(function (s, i) {
      var color = VERSION_COLORS[i % VERSION_COLORS.length];
      var pts = s.points.filter(function (p) { return p[1] !== null; });
      svg("polyline", { points: pts.map(function (p) { return px(p[0]) + "," + py(p[1]); }).join(" "), fill: "none", stroke: color, "stroke-width": 2 }, root);
      pts.forEach(function (p) { title(svg("circle", { cx: px(p[0]), cy: py(p[1]), r: 2.5, fill: color }, root), s.label + " step " + p[0] + ": " + fmt(p[1], 4)); });
      svg("text", { x: W - R, y: T + 2 + i * 14, "text-anchor": "end", style: "fill:" + color }, root).textContent = s.label;
    });
  }
  function renderCurves() {
    var box = document.getElementById("curves");
    if (!data.curves.length) { html("p", { "class": "note" }, "metrics.jsonl has no steps yet.", box); return; }
    data.curves.forEach(function (c) { lineChart(box, c); });
  }
  function renderStaleness() {
    var box = document.getElementById("staleness");
    var keys = Object.keys(data.staleness).map(Number).sort(function (a, b) { return a - b; });
    if (!keys.length) { html("p", { "class": "note" }, "No served trajectories recorded.", box); return; }
    var W = 420, H = 220, L = 50, B = 40, T = 20;
    var root = svg("svg", { width: W, height: H, "class": "chart", id: "staleness-histogram" }, box);
    var maxC = Math.max.apply(null, keys.map(function (k) { return data.staleness[String(k)]; }));
    var lo = Math.min(0, keys[0]), hi = keys[keys.length - 1];
    var n = hi - lo + 1, bw = (W - L - 10) / n;
    for (var k = lo; k <= hi; k++) {
      var c = data.staleness[String(k)] || 0;
      var h = (H - T - B) * c / maxC;
      var bar = svg("rect", { x: L + (k - lo) * bw + 4, y: H - B - h, width: Math.max(2, bw - 8), height: h, fill: "#4e79a7", "class": "staleness-bar" }, root);
      title(bar, "staleness " + k + ": " + c + " trajectories");
      svg("text", { x: L + (k - lo + 0.5) * bw, y: H - B + 14, "text-anchor": "middle" }, root).textContent = String(k);
      svg("text", { x: L + (k - lo + 0.5) * bw, y: H - B - h - 3, "text-anchor": "middle" }, root).textContent = String(c);
    }
    svg("line", { x1: L, x2: W - 6, y1: H - B, y2: H - B, stroke: "#9aa3b2" }, root);
    svg("text", { x: (L + W) / 2, y: H - B + 30, "text-anchor": "middle" }, root).textContent = "staleness (steps)";
  }

  // -- trajectory browser ------------------------------------------------------------------
  function fateClass(fate) { return "fate fate-" + (fate === "served" || fate === "env_error" ? fate : "other"); }
  function renderBrowser() {
    var tbody = document.querySelector("#traj-table tbody");
    var select = document.getElementById("fate-filter");
    var search = document.getElementById("search");
    var fates = {};
    data.trajectories.forEach(function (t) { fates[t.fate] = true; });
    Object.keys(fates).sort().forEach(function (f) { html("option", { value: f }, f, select); });
    function fill() {
      tbody.textContent = "";
      var q = search.value.toLowerCase(), f = select.value, shown = 0;
      data.trajectories.forEach(function (t, i) {
        if (f && t.fate !== f) { return; }
        var hay = [t.traj_id, t.tag, t.stop_reason, t.fate, t.error || ""].join(" ").toLowerCase();
        if (q && hay.indexOf(q) < 0) { return; }
        shown += 1;
        var tr = html("tr", { "data-index": String(i) }, null, tbody);
        html("td", {}, t.traj_id + (t.straggler ? " ⚑" : ""), tr);
        html("span", { "class": fateClass(t.fate) }, t.fate, html("td", {}, null, tr));
        html("td", {}, String(t.env_id), tr);
        html("td", {}, fmt(t.reward), tr);
        html("td", {}, String(t.turns.length), tr);
        html("td", {}, t.versions[0] === t.versions[1] ? String(t.versions[0]) : t.versions[0] + "–" + t.versions[1], tr);
        html("td", {}, t.created_step + " → " + (t.served_step === null || t.served_step === undefined ? "–" : t.served_step), tr);
        html("td", {}, t.stop_reason, tr);
        tr.addEventListener("click", function () {
          var old = tbody.querySelector("tr.selected");
          if (old) { old.classList.remove("selected"); }
          tr.classList.add("selected");
          showDetail(t);
        });
      });
      document.getElementById("browser-count").textContent = shown + " of " + data.trajectories.length + " shown";
    }
    select.addEventListener("change", fill);
    search.addEventListener("input", fill);
    fill();
    if (data.trajectories.length) { showDetail(data.trajectories[data.trajectories.length - 1]); }
  }
  function showDetail(t) {
    var box = document.getElementById("traj-detail");
    box.textContent = "";
    html("h3", {}, t.traj_id, box);
    var kv = html("div", { "class": "kv" }, null, box);
    [["fate", t.fate], ["tag", t.tag], ["env", t.env_id], ["group", t.group_id], ["episode", t.episode_id], ["seed", t.seed],
      ["reward", fmt(t.reward, 3)], ["stop reason", t.stop_reason], ["weight versions", t.versions.join("–")],
      ["created step", t.created_step], ["served step", t.served_step === undefined || t.served_step === null ? "–" : t.served_step],
      ["tokens", t.num_tokens], ["generated tokens", t.response_length], ["straggler", t.straggler ? "yes" : "no"]].forEach(function (p) {
      var s = html("span", {}, null, kv); html("b", {}, p[0] + ": ", s); s.appendChild(document.createTextNode(String(p[1])));
    });
    if (t.error) { html("p", { "class": "error" }, "error: " + t.error, box); }
    var table = html("table", {}, null, box);
    var head = html("tr", {}, null, html("thead", {}, null, table));
    ["turn", "generated tokens", "weight version", "finish", "reward", "generate s", "env step s", "resumed"].forEach(function (h) { html("th", {}, h, head); });
    var body = html("tbody", {}, null, table);
    t.turns.forEach(function (turn) {
      var tr = html("tr", {}, null, body);
      [turn.turn, turn.tokens, turn.version, turn.finish, fmt(turn.reward, 3), fmt(turn.generate_s, 3), fmt(turn.env_step_s, 3), turn.resumed].forEach(function (v) { html("td", {}, String(v), tr); });
    });
    html("p", { "class": "note" }, "Decoded conversation; highlighted text was generated by the model (label: turn and weight version).", box);
    var conv = html("div", { "class": "conversation" }, null, box);
    var versionByTurn = {};
    t.turns.forEach(function (turn) { versionByTurn[turn.turn] = turn.version; });
    t.segments.forEach(function (s) {
      if (s.kind === "generated") {
        var color = versionColor(versionByTurn[s.turn]);
        html("span", { "class": "seg-label", style: "background:" + color }, "t" + s.turn + " v" + versionByTurn[s.turn], conv);
        html("span", { "class": "seg-generated", style: "border-color:" + color }, s.text, conv);
      } else {
        conv.appendChild(document.createTextNode(s.text));
      }
    });
  }

  renderSummary();
  renderTimeline();
  renderCurves();
  renderStaleness();
  renderBrowser();
  document.body.setAttribute("data-rendered", "1");
})();
