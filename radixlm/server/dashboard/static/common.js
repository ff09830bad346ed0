// Shared by the server's and the router's dashboard: the API key and the event stream.
// The stream is read with fetch() (EventSource cannot send an Authorization header).
"use strict";

const Dash = (() => {
  function apiKey() {
    const m = /(?:^#|&)key=([^&]*)/.exec(location.hash);
    if (m) return decodeURIComponent(m[1]);
    return sessionStorage.getItem("radixlm-key") || "";
  }

  function fmtBytes(b) {
    if (b == null) return "–";
    const u = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (Math.abs(b) >= 1024 && i < u.length - 1) { b /= 1024; i++; }
    return b.toFixed(i ? 1 : 0) + " " + u[i];
  }

  function fmt(x, digits = 1) {
    return x == null ? "–" : Number(x).toFixed(digits);
  }

  function setText(id, text, value) {
    const e = document.getElementById(id);
    if (!e) return;
    e.textContent = text;
    if (value !== undefined) e.dataset.value = String(value);
  }

  function setStatus(cls, text) {
    const s = document.getElementById("status");
    s.className = "badge " + cls;
    s.textContent = text;
  }

  // Parse server-sent events from a fetch body; calls onEvent(name, data) for each.
  async function readEvents(resp, onEvent) {
    const reader = resp.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += dec.decode(value, { stream: true });
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, i);
        buf = buf.slice(i + 2);
        let name = "message", data = "";
        for (const line of block.split("\n")) {
          if (line.startsWith("event: ")) name = line.slice(7);
          else if (line.startsWith("data: ")) data += line.slice(6);
        }
        if (data) onEvent(name, JSON.parse(data));
      }
    }
  }

  // Connect to `path`, reconnecting after the stream ends; asks for the key on a 401.
  function connect(path, onEvent) {
    const form = document.getElementById("key-form");
    const conn = document.getElementById("conn");
    let key = apiKey();
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      key = document.getElementById("key-input").value;
      sessionStorage.setItem("radixlm-key", key);
      form.hidden = true;
      run();
    });
    async function run() {
      let resp;
      try {
        resp = await fetch(path, { headers: key ? { Authorization: "Bearer " + key } : {} });
      } catch (e) {
        conn.textContent = "server unreachable; retrying";
        setStatus("down", "unreachable");
        setTimeout(run, 2000);
        return;
      }
      if (resp.status === 401) {
        conn.textContent = "this server needs its API key";
        setStatus("down", "API key needed");
        form.hidden = false;
        return;
      }
      if (!resp.ok) {
        conn.textContent = "event stream: HTTP " + resp.status + "; retrying";
        setTimeout(run, 2000);
        return;
      }
      conn.textContent = "live";
      try {
        await readEvents(resp, onEvent);
        conn.textContent = "stream ended (server drained or stopped); retrying";
      } catch (e) {
        conn.textContent = "stream lost; retrying";
      }
      setStatus("down", "disconnected");
      setTimeout(run, 2000);
    }
    run();
  }

  // A uPlot chart in `id`, its width following the element's.
  function chart(id, title, series, opts = {}) {
    const el = document.getElementById(id);
    const width = Math.max(300, el.clientWidth || 600);
    const u = new uPlot({
      title, width, height: opts.height || 140,
      scales: { x: { time: false } },
      axes: [{ label: opts.xLabel || "step" }, { label: opts.yLabel || "" }],
      series: [{ label: "step" }, ...series],
      legend: { live: false },
    }, [[], ...series.map(() => [])], el);
    window.addEventListener("resize", () => u.setSize({ width: Math.max(300, el.clientWidth), height: opts.height || 140 }));
    return u;
  }

  return { apiKey, fmtBytes, fmt, setText, setStatus, connect, chart };
})();
