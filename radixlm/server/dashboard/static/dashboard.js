// The server's dashboard: renders each update of /dashboard/events (radixlm/server/dashboard/hub.py).
"use strict";

(() => {
  const { fmtBytes, fmt, setText, setStatus } = Dash;
  const MAX_STEPS = 400;
  let F = null;                 // step field name -> index
  const steps = [];             // the timeline, oldest first
  let selected = null;          // the rid clicked in the requests table
  let last = null;              // the previous update's scheduler snapshot
  let charts = null;

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text != null) e.textContent = text;
    return e;
  }

  function segments(barId, parts, total) {
    const bar = document.getElementById(barId);
    bar.replaceChildren();
    for (const p of parts) {
      const d = el("div", p.cls);
      d.id = barId + "-" + p.key;
      d.style.width = (total > 0 ? (100 * p.value) / total : 0) + "%";
      d.dataset.value = String(p.value);
      d.title = p.label;
      bar.appendChild(d);
    }
  }

  function renderMemory(u) {
    const mem = u.memory, s = u.sched;
    const plan = mem.plan;
    const legend = document.getElementById("mem-legend");
    legend.replaceChildren();
    if (plan) {
      const other = Math.max(0, plan.device_total - plan.weight_bytes - plan.kv_bytes
        - plan.req_to_token_bytes - plan.activation_bytes);
      const parts = [
        { key: "weights", cls: "weights", value: plan.weight_bytes, label: "weights" },
        { key: "kv", cls: "kv", value: plan.kv_bytes, label: "KV pool" },
        { key: "reqrows", cls: "reqrows", value: plan.req_to_token_bytes, label: "req_to_token" },
        { key: "activations", cls: "activations", value: plan.activation_bytes, label: "activations reserve" },
        { key: "other", cls: "other", value: other, label: "rest of the device" },
      ];
      segments("mem-bar", parts, plan.device_total);
      for (const p of parts) {
        const sp = el("span");
        sp.append(el("i", "sw " + p.cls), p.label + " ", el("b", null, fmtBytes(p.value)));
        legend.appendChild(sp);
      }
      legend.appendChild(el("span", "muted", `${plan.device_kind} ${fmtBytes(plan.device_total)} (${plan.device_source})`));
    } else {
      legend.appendChild(el("span", "muted", "no memory plan (this engine does not plan)"));
    }
    const rows = [];
    if (plan) {
      rows.push(["mem_fraction_static", `${fmt(plan.mem_fraction_static, 3)} (${plan.mem_fraction_rule})`]);
      rows.push(["KV pool", `${plan.kv_tokens} tokens × ${fmtBytes(plan.kv_bytes_per_token)} (limited by ${plan.kv_limited_by})`]);
      rows.push(["max_running_requests", `${plan.max_running_requests} (${plan.max_running_rule})`]);
      rows.push(["prefill / decode activation peak", `${fmtBytes(plan.prefill_peak)} / ${fmtBytes(plan.decode_peak)}`]);
      for (const pr of plan.problems) rows.push([`problem (${pr.pool}, ${pr.phase})`, pr.message]);
    }
    for (const [k, v] of Object.entries(mem.flags)) rows.push(["--" + k.replaceAll("_", "-"), v == null ? "(auto)" : String(v)]);
    const table = document.getElementById("flags-table");
    table.replaceChildren(...rows.map(([k, v]) => {
      const tr = el("tr");
      tr.append(el("td", null, k), el("td", null, v));
      return tr;
    }));
    if (!s) return;
    const p = s.pool;
    const cached = p.held_by_cache;
    segments("kv-bar", [
      { key: "running", cls: "running", value: p.held_by_requests, label: "held by requests" },
      { key: "cached", cls: "cached", value: cached, label: "cached" },
      { key: "free", cls: "free", value: p.free_kv_slots, label: "free" },
    ], p.total_kv_slots);
    setText("kv-running", String(p.held_by_requests), p.held_by_requests);
    setText("kv-cached", String(cached), cached);
    setText("kv-evictable", String(p.evictable));
    setText("kv-locked", String(p.protected));
    setText("kv-free", String(p.free_kv_slots), p.free_kv_slots);
    setText("kv-total", String(p.total_kv_slots), p.total_kv_slots);
    setText("kv-summary", `page ${p.page_size}, req rows ${p.req_rows - p.free_req_rows}/${p.req_rows} used`);
    renderSlotMap(s);
    const oom = document.getElementById("oom");
    if (s.oom) {
      oom.hidden = false;
      oom.textContent = `Last out-of-memory (${new Date(s.oom.t * 1000).toLocaleTimeString()}` +
        (s.oom.phase ? `, ${s.oom.phase}, ${s.oom.pool} pool` : "") + `):\n${s.oom.message}` +
        (s.oom.fixes.length ? "\nFixes: " + s.oom.fixes.join("; ") : "");
    } else {
      oom.hidden = true;
    }
  }

  function renderSlotMap(s) {
    const map = s.slot_map, box = document.getElementById("slot-map");
    const binSize = map.span / map.bins;
    if (box.children.length !== map.bins) {
      box.replaceChildren(...Array.from({ length: map.bins }, () => el("div", "slot")));
    }
    const req = selected && s.requests.find((r) => r.rid === selected);
    const sel = new Set(req ? req.slot_bins : []);
    for (let i = 0; i < map.bins; i++) {
      const c = box.children[i];
      const used = binSize - map.free[i];
      const byReq = map.requests[i];
      // Colour by what holds most of the bin: requests, the cache, or nobody.
      const cls = byReq > 0 && byReq >= used - byReq ? "running" : used > binSize / 2 ? "cached" : "free";
      c.className = "slot " + cls + (sel.has(i) ? " sel" : "");
      c.title = `slots ${Math.round(i * binSize)}–${Math.round((i + 1) * binSize) - 1}: ` +
        `${map.free[i]} free, ${byReq} held by requests, ${Math.max(0, used - byReq)} cached`;
    }
    setText("slot-sel", req ? `request ${req.rid.slice(0, 8)}: ${req.kv_len} KV positions in ${req.slot_bins.length} bins (outlined)`
      : selected ? "the selected request has left" : "click a request to outline its KV slots");
  }

  function renderTree(s) {
    const nodes = s.tree.nodes, box = document.getElementById("icicle");
    const byId = new Map(nodes.map((n) => [n.id, { ...n, kids: [] }]));
    let root = null;
    for (const n of byId.values()) {
      if (n.parent == null || !byId.has(n.parent)) { if (!root) root = n; }
      else byId.get(n.parent).kids.push(n);
    }
    const tokens = nodes.reduce((a, n) => a + n.tokens, 0);
    setText("tree-nodes", String(Math.max(0, nodes.length - 1)), Math.max(0, nodes.length - 1));
    setText("tree-tokens", String(s.pool.held_by_cache), s.pool.held_by_cache);
    box.replaceChildren();
    if (!root) return;
    const size = (n) => (n.total = n.tokens + n.kids.reduce((a, k) => a + size(k), 0) + (n.hidden ? 1 : 0));
    size(root);
    let depth = 0;
    const depthOf = (n, d) => { depth = Math.max(depth, d); n.kids.forEach((k) => depthOf(k, d + 1)); };
    depthOf(root, 0);
    const H = box.clientHeight || 180, W = box.clientWidth || 500;
    const rowH = Math.max(12, Math.min(30, H / (depth + 1)));
    const clock = s.tree.clock;
    const place = (n, x, w, d) => {
      if (w < 1) return;
      const div = el("div", "node" + (d === 0 ? " root" : n.lock_ref > 0 ? " locked" : ""));
      div.style.left = x + "px"; div.style.top = d * rowH + "px";
      div.style.width = w + "px"; div.style.height = rowH + "px";
      div.dataset.tokens = String(n.tokens);
      div.title = d === 0 ? `root: ${s.pool.held_by_cache} cached tokens` :
        `${n.tokens} tokens, ${n.lock_ref} locks, last access ${clock - n.last_access} ops ago` +
        (n.hidden ? `, ${n.hidden} children not shown` : "") + `\n"${n.text}…"`;
      if (w > 30 && d > 0) div.textContent = n.text;
      box.appendChild(div);
      let cx = x;
      const inner = n.total - n.tokens;
      for (const k of n.kids) {
        const kw = inner > 0 ? (w * k.total) / n.total : 0;
        place(k, cx, kw, d + 1);
        cx += kw;
      }
    };
    place(root, 0, W, 0);
    setText("tree-note", s.cache.disabled ? "the radix cache is disabled (--disable-radix-cache)" :
      s.tree.truncated ? `showing the first ${nodes.length} nodes (breadth first)` : "");
    void tokens;
  }

  function cacheEvents(s) {
    const c = s.cache;
    setText("hit-rate", fmt(100 * c.cache_hit_rate, 1) + "%", c.cache_hit_rate);
    setText("hit-tokens", String(c.cached_tokens_total), c.cached_tokens_total);
    setText("evicted-tokens", String(c.evicted_tokens_total), c.evicted_tokens_total);
    if (!last) return;
    const list = document.getElementById("cache-events");
    const add = (text) => {
      const li = el("li", null, `${new Date().toLocaleTimeString()} ${text}`);
      list.prepend(li);
      while (list.children.length > 20) list.lastChild.remove();
    };
    const hit = c.cached_tokens_total - last.cache.cached_tokens_total;
    const prompt = c.prompt_tokens_total - last.cache.prompt_tokens_total;
    const ev = c.evicted_tokens_total - last.cache.evicted_tokens_total;
    if (prompt > 0) add(`prefix hits: ${hit} of ${prompt} new prompt tokens`);
    if (ev > 0) add(`evicted ${ev} tokens`);
    if (s.pool.held_by_cache === 0 && last.pool.held_by_cache > 0 && ev === 0) add("cache emptied (flushed)");
  }

  function renderSched(u, s) {
    if (!charts) {
      charts = {
        tokens: Dash.chart("chart-tokens", "tokens per step", [
          { label: "prefill", stroke: "#0984e3", fill: "rgba(9,132,227,0.3)" },
          { label: "decode", stroke: "#d63031", fill: "rgba(214,48,49,0.3)" }]),
        time: Dash.chart("chart-time", "step time (ms)", [
          { label: "step", stroke: "#2d3436" }, { label: "scheduler", stroke: "#e17055" },
          { label: "forward", stroke: "#00b894" }, { label: "bubble", stroke: "#fdcb6e" }]),
        batch: Dash.chart("chart-batch", "batch and queue", [
          { label: "batch size", stroke: "#6c5ce7" }, { label: "waiting", stroke: "#e17055" },
          { label: "running", stroke: "#00b894" }, { label: "retractions", stroke: "#d63031" }]),
      };
    }
    if (steps.length) {
      const x = steps.map((_, i) => i - steps.length + 1);
      const col = (f) => steps.map((r) => r[F[f]]);
      charts.tokens.setData([x, col("prefill_tokens"), col("decode_tokens")]);
      charts.time.setData([x, col("step_ms"), col("sched_ms"), col("forward_ms"), col("bubble_ms")]);
      charts.batch.setData([x, col("batch_size"), col("waiting"), col("running"), col("retractions")]);
      // tok/s over the steps of the last 5 s.
      const tEnd = steps[steps.length - 1][F.t];
      const recent = steps.filter((r) => r[F.t] >= tEnd - 5);
      const span = recent.length > 1 ? tEnd - recent[0][F.t] : 0;
      const toks = recent.slice(1).reduce((a, r) => a + r[F.sampled], 0);
      setText("tok-s", span > 0 && u.t - tEnd < 2 ? fmt(toks / span, 1) : "0", span > 0 ? toks / span : 0);
    }
    setText("steps-shown", String(steps.length), steps.length);
    const L = u.latency;
    setText("ttft", [L.ttft_p50_ms, L.ttft_p90_ms, L.ttft_p99_ms].map((v) => fmt(v, 0)).join(" / "));
    setText("itl", [L.itl_p50_ms, L.itl_p90_ms, L.itl_p99_ms].map((v) => fmt(v, 1)).join(" / "));
    setText("bubble", fmt(100 * s.step_timing.bubble_share, 1) + "%");
    setText("retractions", String(s.num_retractions), s.num_retractions);
    setText("ntr", fmt(s.new_token_ratio, 3));
  }

  function renderRequests(s) {
    setText("n-running", String(s.num_running), s.num_running);
    setText("n-waiting", String(s.num_waiting), s.num_waiting);
    const body = document.querySelector("#requests tbody");
    body.replaceChildren(...s.requests.map((r) => {
      const tr = el("tr", r.rid === selected ? "sel" : "");
      tr.dataset.rid = r.rid;
      for (const v of [r.rid.slice(0, 8), r.state, r.prompt_tokens, r.cached_tokens,
        `${r.generated_tokens}/${r.max_new_tokens}`, r.kv_slots_held, fmt(r.age_s, 1), r.retractions]) {
        tr.appendChild(el("td", null, String(v)));
      }
      tr.addEventListener("click", () => {
        selected = selected === r.rid ? null : r.rid;
        renderRequests(s);
        renderSlotMap(s);
      });
      return tr;
    }));
  }

  function onUpdate(u) {
    setText("model", u.model);
    const srv = u.server;
    if (srv.draining) setStatus("draining", `draining (${srv.in_flight} in flight)`);
    else if (!srv.healthy || u.error) setStatus("down", u.error || "unhealthy");
    else setStatus("ok", "serving");
    if (u.history) steps.length = 0;
    const s = u.sched;
    if (s) {
      F = Object.fromEntries(s.step_fields.map((f, i) => [f, i]));
      steps.push(...u.steps);
      if (steps.length > MAX_STEPS) steps.splice(0, steps.length - MAX_STEPS);
    }
    renderMemory(u);
    if (!s) return;
    renderTree(s);
    cacheEvents(s);
    renderSched(u, s);
    renderRequests(s);
    document.getElementById("conn").textContent =
      `live · update ${u.seq} · snapshot ${fmt(s.build_ms, 2)} ms in the scheduler, ${fmt(u.rtt_ms, 1)} ms round trip`;
    document.body.dataset.updates = String(u.seq);
    last = s;
  }

  Dash.connect("/dashboard/events", (name, data) => { if (name === "update") onUpdate(data); });
})();
