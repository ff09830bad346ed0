// The router's dashboard: renders each update of the router's /dashboard/events (router/dashboard.py).
"use strict";

(() => {
  const { fmt, setText, setStatus } = Dash;

  function row(cells, cls) {
    const tr = document.createElement("tr");
    if (cls) tr.className = cls;
    for (const c of cells) {
      const td = document.createElement("td");
      td.textContent = c == null ? "–" : String(c);
      tr.appendChild(td);
    }
    return tr;
  }

  function onUpdate(u) {
    setText("policy", `policy ${u.policy}`);
    const up = u.workers.filter((w) => w.healthy).length;
    setText("n-up", String(up), up);
    setText("n-down", String(u.workers.length - up), u.workers.length - up);
    setText("routed", String(u.routed_total), u.routed_total);
    if (u.exiting) setStatus("draining", "shutting down");
    else if (up === 0) setStatus("down", "no instance up");
    else setStatus("ok", "routing");
    document.querySelector("#instances tbody").replaceChildren(...u.workers.map((w) => {
      const p = w.pool || {};
      const used = p.total_kv_slots ? (100 * (p.total_kv_slots - p.free_kv_slots)) / p.total_kv_slots : null;
      const tr = row([w.url, w.healthy ? (w.error ? "up (" + w.error + ")" : "up") : `down (${w.consecutive_failures} failed checks)`,
        w.load, p.running, p.waiting, p.cache_hit_rate == null ? null : fmt(100 * p.cache_hit_rate, 1) + "%",
        used == null ? null : fmt(used, 1) + "%", p.total_kv_slots], w.healthy ? "" : "down");
      tr.dataset.url = w.url;
      tr.dataset.load = String(w.load);
      return tr;
    }));
    document.querySelector("#decisions tbody").replaceChildren(...u.decisions.slice().reverse().map((d) => {
      const loads = Object.entries(d.loads).map(([url, l]) => `${url.replace(/^https?:\/\//, "")}: ${l}`).join(", ");
      const tr = row([d.seq, new Date(d.t * 1000).toLocaleTimeString(), d.worker, d.reason,
        d.match_ratio == null ? null : fmt(100 * d.match_ratio, 0) + "% of " + d.text_chars + " chars", loads]);
      tr.dataset.worker = d.worker;
      return tr;
    }));
    document.getElementById("conn").textContent = `live · update ${u.seq}`;
    document.body.dataset.updates = String(u.seq);
  }

  Dash.connect("/dashboard/events", (name, data) => { if (name === "update") onUpdate(data); });
})();
