--- The dashboard's page: plain HTML, one small script and a style sheet,
--- embedded in the binary with the rest of lua/ (no build step, nothing
--- fetched from outside this machine). The page renders the summary served
--- inside it (@DATA@) at once, then polls /api/summary every 2 s.
local M = {}

local HTML = [==[<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>sbxlua dashboard</title>
<link rel="stylesheet" href="/style.css">
</head>
<body>
<header>
  <h1>sbxlua dashboard</h1>
  <span id="host"></span>
  <span id="status">loading</span>
</header>
<main>
  <section id="sandboxes">
    <h2>Live sandboxes <span id="sandbox-count" class="count"></span></h2>
    <table>
      <thead><tr><th>id</th><th>backend</th><th>state</th><th>age</th><th>labels</th><th>session</th></tr></thead>
      <tbody id="sandboxes-body"></tbody>
    </table>
    <p id="sandboxes-empty" class="empty">No live sandboxes on this host.</p>
  </section>
  <section id="spend">
    <h2>Spend</h2>
    <p id="spend-total"></p>
    <div class="charts">
      <figure><figcaption>per provider</figcaption><svg id="chart-provider" viewBox="0 0 640 180" role="img"></svg>
        <div class="legend" id="legend-provider"></div></figure>
      <figure><figcaption>per label</figcaption><svg id="chart-label" viewBox="0 0 640 180" role="img"></svg>
        <div class="legend" id="legend-label"></div></figure>
    </div>
  </section>
  <section id="health">
    <h2>Provider health</h2>
    <table>
      <thead><tr><th>provider</th><th>available</th><th>breaker</th><th>creates</th><th>error rate</th>
        <th>p50 create</th><th>p95 create</th></tr></thead>
      <tbody id="health-body"></tbody>
    </table>
    <p class="note">From the decision log's routed creates (pinned creates are not logged) and this
      machine's availability checks.</p>
  </section>
  <section id="decisions">
    <h2>Recent routing decisions</h2>
    <table>
      <thead><tr><th>time</th><th>request</th><th>policy</th><th>order</th><th>reason</th><th>skipped</th>
        <th>outcome</th></tr></thead>
      <tbody id="decisions-body"></tbody>
    </table>
    <p id="decisions-empty" class="empty">No routing decisions logged yet.</p>
  </section>
  <section id="actions" hidden>
    <h2>Actions</h2>
    <button id="gc" type="button">Destroy leftovers of dead sessions (gc)</button>
    <pre id="gc-result"></pre>
  </section>
</main>
<script id="data" type="application/json">@DATA@</script>
<script src="/app.js"></script>
</body>
</html>
]==]

local JS = [==["use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const params = new URLSearchParams(location.search);
  const token = params.get("token");
  params.delete("token");
  const query = params.toString() ? "?" + params.toString() : "";
  const COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f"];
  const SVG = "http://www.w3.org/2000/svg";

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }
  function row(cells, cls) {
    const tr = el("tr", null, cls);
    for (const c of cells) tr.appendChild(c instanceof Node ? c : el("td", c));
    return tr;
  }
  function usd(x) { return "$" + (x || 0).toFixed(4); }
  function age(s) {
    if (s === undefined || s === null) return "-";
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
    return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
  }
  function labels(t) {
    return Object.keys(t || {}).sort().map((k) => k + "=" + t[k]).join(", ");
  }
  function time(t) { return t ? new Date(t * 1000).toLocaleTimeString() : "-"; }

  function sandboxes(list) {
    const body = $("sandboxes-body");
    body.replaceChildren(...list.map((s) => {
      const tr = row([el("td", s.id, "id"), s.backend, el("td", s.state, "state " + s.state), age(s.age_secs),
                      labels(s.labels), el("td", s.session, "session")]);
      tr.dataset.id = s.id;
      return tr;
    }));
    $("sandbox-count").textContent = list.length + " on this host";
    $("sandboxes-empty").hidden = list.length > 0;
  }

  function chart(svg, legend, starts, series) {
    const names = Object.keys(series).sort();
    const n = starts.length, W = 640, H = 180, top = 10, bottom = 24;
    const totals = starts.map((_, i) => names.reduce((a, k) => a + series[k][i], 0));
    const max = Math.max(...totals, 0);
    svg.replaceChildren();
    const bw = W / Math.max(n, 1);
    names.forEach((k, ci) => {
      series[k].forEach((v, i) => {
        if (v <= 0) return;
        const below = names.slice(0, ci).reduce((a, j) => a + series[j][i], 0);
        const h = max > 0 ? (v / max) * (H - top - bottom) : 0;
        const y = H - bottom - h - (max > 0 ? (below / max) * (H - top - bottom) : 0);
        const r = document.createElementNS(SVG, "rect");
        r.setAttribute("x", (i * bw + 1).toFixed(1));
        r.setAttribute("y", y.toFixed(1));
        r.setAttribute("width", Math.max(bw - 2, 1).toFixed(1));
        r.setAttribute("height", Math.max(h, 1).toFixed(1));
        r.setAttribute("fill", COLORS[ci % COLORS.length]);
        const tip = document.createElementNS(SVG, "title");
        tip.textContent = k + " " + usd(v) + " at " + new Date(starts[i] * 1000).toLocaleString();
        r.appendChild(tip);
        svg.appendChild(r);
      });
    });
    const axis = document.createElementNS(SVG, "line");
    axis.setAttribute("x1", 0); axis.setAttribute("x2", W);
    axis.setAttribute("y1", H - bottom); axis.setAttribute("y2", H - bottom);
    axis.setAttribute("stroke", "#888");
    svg.appendChild(axis);
    for (const [i, anchor] of [[0, "start"], [n - 1, "end"]]) {
      if (n === 0) break;
      const t = document.createElementNS(SVG, "text");
      t.setAttribute("x", anchor === "start" ? 2 : W - 2);
      t.setAttribute("y", H - 6);
      t.setAttribute("text-anchor", anchor);
      t.setAttribute("font-size", "11");
      t.setAttribute("fill", "#555");
      t.textContent = new Date(starts[i] * 1000).toLocaleString();
      svg.appendChild(t);
    }
    const top_label = document.createElementNS(SVG, "text");
    top_label.setAttribute("x", 2); top_label.setAttribute("y", 12);
    top_label.setAttribute("font-size", "11"); top_label.setAttribute("fill", "#555");
    top_label.textContent = max > 0 ? "max " + usd(max) + " per bucket" : "no spend in this window";
    svg.appendChild(top_label);
    legend.replaceChildren(...names.map((k, ci) => {
      const item = el("span", null, "item");
      const sw = el("span", null, "swatch c" + (ci % COLORS.length));
      item.appendChild(sw);
      item.appendChild(document.createTextNode(k + " " + usd(series[k].reduce((a, b) => a + b, 0))));
      return item;
    }));
  }

  function spend(s) {
    $("spend-total").textContent = usd(s.total_usd) + " over " + s.sandboxes + " finished sandboxes since " +
      new Date(s.since * 1000).toLocaleString() + " (buckets of " + age(s.bucket_secs) + "); live sandboxes so far: " +
      usd(s.accruing_usd) + " (estimate)";
    chart($("chart-provider"), $("legend-provider"), s.starts, s.by_provider);
    chart($("chart-label"), $("legend-label"), s.starts, s.by_label);
  }

  function health(h) {
    const names = Object.keys(h).sort();
    $("health-body").replaceChildren(...names.map((k) => {
      const p = h[k];
      const avail = p.available === undefined ? "-" : (p.available ? "yes" : "no: " + (p.reason || ""));
      const tr = row([el("td", k, "id"), avail, el("td", p.breaker, "breaker " + p.breaker.split(",")[0]),
                      p.creates, (100 * p.error_rate).toFixed(0) + " %",
                      p.p50_create_ms !== undefined ? p.p50_create_ms + " ms" : "-",
                      p.p95_create_ms !== undefined ? p.p95_create_ms + " ms" : "-"]);
      tr.dataset.provider = k;
      return tr;
    }));
  }

  function decisions(list) {
    $("decisions-body").replaceChildren(...list.map((d) => {
      const req = Object.keys(d.request || {}).sort().map((k) => k + "=" + JSON.stringify(d.request[k])).join(" ");
      const skipped = Object.keys(d.skipped || {}).sort().map((k) => k + ": " + d.skipped[k]).join("; ");
      const outcome = d.error ? "error: " + d.error :
        (d.backend || "-") + (d.id ? " " + d.id : "") + (d.warm ? " (warm, pool " + d.warm + ")" : "");
      return row([time(d.time), req, d.policy || "-", (d.order || []).join(" > "), d.reason || "",
                  skipped, el("td", outcome, d.error ? "error" : "ok")]);
    }));
    $("decisions-empty").hidden = list.length > 0;
  }

  function render(d) {
    $("host").textContent = d.host + " · " + d.state_dir + " · " + time(d.now);
    sandboxes(d.sandboxes);
    spend(d.spend);
    health(d.health);
    decisions(d.decisions);
    $("actions").hidden = !(d.actions && token);
  }

  async function refresh() {
    try {
      const r = await fetch("/api/summary" + query, { cache: "no-store" });
      if (!r.ok) throw new Error("HTTP " + r.status);
      render(await r.json());
      $("status").textContent = "live";
      $("status").className = "ok";
    } catch (e) {
      $("status").textContent = "cannot reach sbxlua dashboard (" + e.message + ")";
      $("status").className = "error";
    }
  }

  $("gc").addEventListener("click", async () => {
    if (!confirm("Destroy every leftover of dead sbxlua sessions on this host?")) return;
    const r = await fetch("/api/gc", { method: "POST", headers: { "X-Sbx-Token": token } });
    const j = await r.json();
    $("gc-result").textContent = j.report || j.error || "";
    refresh();
  });

  render(JSON.parse($("data").textContent));
  $("status").textContent = "live";
  setInterval(refresh, 2000);
})();
]==]

local CSS = [==[body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #222; background: #f6f6f4; }
header { display: flex; gap: 1em; align-items: baseline; padding: .6em 1.2em; background: #263238; color: #eee; }
header h1 { font-size: 1.2em; margin: 0; }
#status.ok { color: #9ccc65; } #status.error { color: #ef9a9a; }
main { padding: 0 1.2em 2em; }
section { background: #fff; margin: 1em 0; padding: .4em 1em 1em; border-radius: 6px; box-shadow: 0 1px 2px #0002; }
h2 { font-size: 1.05em; } h2 .count { color: #666; font-weight: normal; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: .25em .6em; border-bottom: 1px solid #eee; vertical-align: top; }
th { color: #555; font-weight: 600; }
td.id, td.session { font-family: ui-monospace, monospace; font-size: 12px; }
td.state.running, td.ok, td.breaker.closed { color: #2e7d32; }
td.state.orphaned, td.error, td.breaker.open { color: #c62828; }
td.state.creating { color: #ef6c00; }
.empty, .note { color: #777; }
.charts { display: flex; flex-wrap: wrap; gap: 1.5em; }
figure { margin: 0; flex: 1 1 420px; } figcaption { color: #555; margin-bottom: .3em; }
svg { width: 100%; height: auto; background: #fafafa; border: 1px solid #eee; }
.legend .item { margin-right: 1em; white-space: nowrap; }
.swatch { display: inline-block; width: .8em; height: .8em; margin-right: .3em; vertical-align: middle; }
.c0 { background: #4e79a7; } .c1 { background: #f28e2b; } .c2 { background: #59a14f; } .c3 { background: #e15759; }
.c4 { background: #76b7b2; } .c5 { background: #edc948; } .c6 { background: #b07aa1; } .c7 { background: #9c755f; }
pre { background: #f0f0f0; padding: .5em; }
]==]

M.assets = {
  ["/"] = { type = "text/html; charset=utf-8", body = HTML },
  ["/index.html"] = { type = "text/html; charset=utf-8", body = HTML },
  ["/app.js"] = { type = "text/javascript; charset=utf-8", body = JS },
  ["/style.css"] = { type = "text/css; charset=utf-8", body = CSS },
}

return M
