/* higgsfield ui: the page. Plain script, no build step; uPlot (vendored) draws the curves.
 *
 * State comes from two Server-Sent Event streams: /api/events (every run, every node) and,
 * on a run's page, /api/runs/RUN/events (its merged logs and step metrics). Everything a
 * node sent is shown as text (textContent), never as markup.
 */
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);
const el = (tag, attrs = {}, ...kids) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const kid of kids) if (kid != null) e.append(kid);
  return e;
};

const S = {
  csrf: "", project: "", runs: [], nodes: [], experiments: [],
  view: "runs", run: null, runSource: null,
  lines: [], shown: 0, follow: true, points: [], charts: [],
};
const MAX_LINES = 20000, MAX_DOM_LINES = 4000, NOTICE = -2;
const ACTIVE = ["queued", "starting", "running", "stalled"];

/* -- formatting -------------------------------------------------------------------- */
const pad = (n) => String(n).padStart(2, "0");
function when(t) {
  if (!t) return "–";
  const d = new Date(t * 1000), now = new Date();
  const hm = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  return d.toDateString() === now.toDateString() ? hm : `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${hm}`;
}
function dur(s) {
  if (s == null) return "–";
  s = Math.max(0, Math.round(s));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${pad(s % 60)}s`;
  return `${Math.floor(s / 3600)}h${pad(Math.floor(s / 60) % 60)}m`;
}
const bytes = (b) => b == null ? "–" : b >= 2 ** 40 ? `${(b / 2 ** 40).toFixed(1)} TiB` : `${(b / 2 ** 30).toFixed(1)} GiB`;
const used = (u, t) => t == null ? "–" : t >= 2 ** 40 ? `${(u / 2 ** 40).toFixed(1)} / ${bytes(t)}` : `${(u / 2 ** 30).toFixed(1)} / ${bytes(t)}`;
function si(v) {   // an axis label that fits: 1.2M, 350k, 0.003
  if (v == null) return "";
  const a = Math.abs(v);
  if (a >= 1e9) return `${+(v / 1e9).toPrecision(3)}G`;
  if (a >= 1e6) return `${+(v / 1e6).toPrecision(3)}M`;
  if (a >= 1e4) return `${+(v / 1e3).toPrecision(3)}k`;
  return a !== 0 && a < 1e-3 ? v.toExponential(1) : String(+v.toPrecision(4));
}
const pct = (x) => x == null ? "–" : `${Math.round(x)}%`;
const params = (p) => Object.entries(p || {}).map(([k, v]) => `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`).join(" ");
const who = (l) => `${l[0]}/${l[1] === NOTICE ? "higgsfield" : l[1] < 0 ? "launcher" : l[1]}`;
function toast(text, bad = false) {
  const t = $("#toast");
  t.textContent = text; t.className = "toast" + (bad ? " bad" : "");
  clearTimeout(toast.timer); toast.timer = setTimeout(() => t.classList.add("hidden"), 6000);
}

/* -- requests -------------------------------------------------------------------------- */
async function post(url, body) {
  const r = await fetch(url, {method: "POST", headers: {"content-type": "application/json", "x-hf-csrf": S.csrf},
                              body: JSON.stringify(body || {}), credentials: "same-origin"});
  let data = {};
  try { data = await r.json(); } catch (e) { data = {error: `${r.status} ${r.statusText}`}; }
  if (!r.ok) throw new Error(data.error || `${r.status}`);
  return data;
}

/* -- routing ------------------------------------------------------------------------------ */
function route() {
  const h = decodeURIComponent(location.hash.slice(1)) || "runs";
  const [view, ...rest] = h.split("/");
  S.view = ["runs", "run", "nodes"].includes(view) ? view : "runs";
  for (const v of ["runs", "run", "nodes"]) $(`#view-${v}`).classList.toggle("hidden", v !== S.view);
  $("#nav-runs").classList.toggle("active", S.view !== "nodes");
  $("#nav-nodes").classList.toggle("active", S.view === "nodes");
  const run = S.view === "run" ? rest.join("/") : null;
  if (run !== S.run) openRun(run);
  if (S.view === "nodes") renderNodes();
  if (S.view === "runs") renderRuns();
}

/* -- the runs table -------------------------------------------------------------------- */
function stateBadge(r) {
  const b = el("span", {class: `state s-${r.state}`, text: r.state});
  if (r.stall) b.title = `stalled: ${r.stall.summary}`;
  if (ACTIVE.includes(r.state) && r.stragglers && r.stragglers.length) {
    b.classList.add("straggling");
    b.title = r.stragglers.map(stragglerText).join("\n");
  }
  if (r.stale_nodes && r.stale_nodes.length) b.title = `last known: ${r.stale_nodes.join(", ")} not answering`;
  return b;
}
/* a rank named slow by its own work per step (the node side's straggler rule) */
function stragglerText(s) {
  return `rank ${s.rank} on ${s.node}: ${s.ratio.toFixed(2)}x slower than the median rank ` +
         `(${Math.round(s.own_s * 1000)} ms of own work per step against ${Math.round(s.median_s * 1000)} ms) since step ${s.since_step}`;
}
function queueText(r) {
  if (r.queue_position) return `#${r.queue_position} waiting`;
  if (r.state === "queued" && r.reason) return `waiting: ${r.reason}`;   // Slurm's reason (Resources, Priority)
  const held = Object.entries(r.queue || {}).filter(([, q]) => q.slots).map(([n, q]) => `${n}:${q.slots.join(",")}`);
  return held.length ? `slots ${held.join(" ")}` : "–";
}
function failureText(r) {
  if (!r.failed_node) return null;
  return `${r.failed_node}` + (r.failed_rank != null ? ` rank ${r.failed_rank}` : " (launcher)");
}
function renderRuns() {
  const fe = $("#f-exp").value, fs = $("#f-state").value;
  const rows = S.runs.filter((r) => (!fe || r.experiment === fe) && (!fs || r.state === fs)).slice().reverse();
  const body = $("#runs tbody");
  const frag = document.createDocumentFragment();
  for (const r of rows) {
    const fail = failureText(r);
    const failCell = el("td", {class: "failure"});
    if (fail) {
      failCell.append(el("div", {class: "fail-who", text: fail}));
      const tail = (r.error_tail || []).slice(-1).join("\n") || r.reason || "";   // the run page has them all
      if (tail) failCell.append(el("pre", {class: "tail", text: tail}));
    } else if (r.stall && r.state === "stalled") {
      failCell.append(el("pre", {class: "tail stall", text: `stalled: ${r.stall.summary}`}));
    }
    const actions = el("td", {class: "actions"});
    if (ACTIVE.includes(r.state))
      actions.append(el("button", {class: "danger small kill", type: "button", text: "Kill", onclick: () => kill(r.run)}));
    actions.append(el("button", {class: "small rerun", type: "button", text: "Re-run", onclick: () => openForm(r.experiment, r.run)}));
    frag.append(el("tr", {"data-run": r.run, "data-state": r.state, class: r.state === "stalled" ? "stalled" : ""},
      el("td", {class: "run"}, el("a", {href: `#run/${encodeURIComponent(r.run)}`, text: r.run})),
      el("td", {text: r.experiment}),
      el("td", {}, stateBadge(r)),
      el("td", {class: "queue", text: queueText(r)}),
      el("td", {class: "params", text: params(r.params), title: params(r.params)}),
      el("td", {text: (r.nodes || []).join(", ")}),
      el("td", {text: when(r.started_at || r.created_at)}),
      el("td", {class: "duration", "data-start": r.started_at || "", "data-end": r.ended_at || "", text: dur(r.duration)}),
      el("td", {text: r.exit_code == null ? "–" : String(r.exit_code)}),
      failCell, actions));
  }
  body.replaceChildren(frag);
  $("#no-runs").classList.toggle("hidden", S.runs.length > 0);
  $("#run-count").textContent = `${rows.length} of ${S.runs.length} run(s)`;
}
function fillSelect(sel, values, keepFirst = true) {
  const cur = sel.value;
  const opts = values.map((v) => el("option", {value: v, text: v}));
  if (keepFirst) sel.replaceChildren(sel.options[0], ...opts); else sel.replaceChildren(...opts);
  if ([...sel.options].some((o) => o.value === cur)) sel.value = cur;
}
function onRuns(data) {
  if (!S.runs.length && !performance.getEntriesByName("hf-runs").length) performance.mark("hf-runs");
  S.project = data.project;
  S.runs = data.runs;
  S.experiments = data.experiments;
  fillSelect($("#f-exp"), [...new Set(S.runs.map((r) => r.experiment))].sort());
  fillSelect($("#new-exp"), S.experiments, false);
  if (S.view === "runs") renderRuns();
  if (S.run) renderRunHead();
  if (!performance.getEntriesByName("hf-runs-painted").length) performance.mark("hf-runs-painted");   // bench/ui_dashboard.py
}
setInterval(() => {   // running durations tick on the page, between events
  const now = Date.now() / 1000;
  for (const td of document.querySelectorAll("td.duration")) {
    const s = parseFloat(td.dataset.start), e = parseFloat(td.dataset.end);
    if (s && !e) td.textContent = dur(now - s);
  }
}, 1000);

/* -- actions ------------------------------------------------------------------------------ */
async function kill(run) {
  if (!confirm(`Kill ${run} on every node?`)) return;
  try {
    const r = await post(`/api/runs/${encodeURIComponent(run)}/kill`);
    toast(`${run}: ${(r.killed[0] || {}).state || "killed"}`);
  } catch (e) { toast(`kill ${run}: ${e.message}`, true); }
}

async function openForm(experiment, run) {
  if (!experiment) return;
  let form;
  try {
    const q = run ? `?run=${encodeURIComponent(run)}` : "";
    const r = await fetch(`/api/experiments/${encodeURIComponent(experiment)}/form${q}`);
    form = await r.json();
    if (!r.ok) throw new Error(form.error);
  } catch (e) { toast(`form of ${experiment}: ${e.message}`, true); return; }
  $("#form-title").textContent = run ? `Re-run ${experiment} (params of ${run})` : `Run ${experiment}`;
  $("#form-error").textContent = ""; $("#form-ok").textContent = "";
  const box = $("#form-fields");
  box.replaceChildren();
  for (const f of form.fields) {
    let input;
    const id = `ff-${f.name}`;
    if (f.type === "choice") {
      input = el("select", {id, name: f.name});
      for (const o of f.options) input.append(el("option", {value: o, text: o}));
      if (f.value != null) input.value = String(f.value);
    } else if (f.type === "boolean") {
      input = el("input", {id, name: f.name, type: "checkbox"});
      input.checked = f.value === true || f.value === "true";
    } else {
      input = el("input", {id, name: f.name, type: f.type === "number" ? "text" : "text",
                           inputmode: f.type === "number" ? "decimal" : "text"});
      input.value = f.value == null ? "" : String(f.value);
      if (f.type === "number") input.placeholder = "a number";
    }
    input.dataset.type = f.type;
    box.append(el("div", {class: "field"},
      el("label", {for: id, text: f.name + (f.required ? " *" : "")}), input,
      el("div", {class: "help", text: f.description || ""})));
  }
  const dlg = $("#form-dialog");
  dlg.dataset.experiment = form.experiment;
  dlg.showModal();
}
function formValues() {
  const values = {};
  for (const input of document.querySelectorAll("#form-fields [name]")) {
    values[input.name] = input.dataset.type === "boolean" ? input.checked : input.value;
  }
  return values;
}
async function submitForm(check) {
  const dlg = $("#form-dialog");
  $("#form-error").textContent = ""; $("#form-ok").textContent = "";
  try {
    const r = await post("/api/runs", {experiment: dlg.dataset.experiment, values: formValues(), check});
    if (check) { $("#form-ok").textContent = `ok: ${params(r.params)} ${r.where}`; return; }
    dlg.close();
    toast(`started ${r.run} ${r.where}`);
    location.hash = `#run/${encodeURIComponent(r.run)}`;
  } catch (e) { $("#form-error").textContent = e.message; }
}

/* -- a run's page ------------------------------------------------------------------------ */
function currentRun() { return S.runs.find((r) => r.run === S.run); }
function renderRunHead() {
  const r = currentRun();
  $("#run-title").textContent = S.run || "";
  const st = $("#run-state");
  if (!r) { st.textContent = "unknown"; st.className = "state"; return; }
  st.textContent = r.state; st.className = `state s-${r.state}`;
  $("#run-kill").classList.toggle("hidden", !ACTIVE.includes(r.state));
  $("#stacks-take").classList.toggle("hidden", !ACTIVE.includes(r.state) && !r.stall);
  $("#profile-take").classList.toggle("hidden", !ACTIVE.includes(r.state));
  const facts = [["experiment", r.experiment], ["params", params(r.params) || "–"], ["nodes", (r.nodes || []).join(", ")],
                 ["queue", queueText(r)], ["created", when(r.created_at)], ["started", when(r.started_at)],
                 ["duration", dur(r.duration)], ["exit code", r.exit_code == null ? "–" : String(r.exit_code)]];
  $("#run-facts").replaceChildren(...facts.map(([k, v]) => el("div", {class: "fact"}, el("span", {class: "k", text: k}), el("span", {class: "v", text: v}))));
  const fb = $("#run-failure");
  const fail = failureText(r);
  fb.classList.toggle("hidden", !fail);
  if (fail) fb.replaceChildren(el("div", {class: "fail-who", text: `First failure: ${fail}` + (r.reason ? ` — ${r.reason}` : "")}),
                               el("pre", {class: "tail", text: (r.error_tail || []).join("\n")}));
  const sb = $("#run-stall");
  sb.classList.toggle("hidden", !r.stall);
  if (r.stall) {
    sb.replaceChildren(el("div", {class: "stall-who", text: `Stalled${r.stalled_at ? " at " + when(r.stalled_at) : ""}: ${r.stall.summary}`}));
    if (!S.stacksTaken) renderGroups(r.stall, $("#stacks"), "at the stall");
  }
  const gb = $("#run-stragglers");
  const slow = r.stragglers || [];
  gb.classList.toggle("hidden", !slow.length);
  if (slow.length) {
    gb.replaceChildren(el("div", {class: "straggler-who", text: ACTIVE.includes(r.state) ? "Straggler" + (slow.length > 1 ? "s" : "") + " now:" : "Straggler" + (slow.length > 1 ? "s" : "") + " when it ended:"}),
                       ...slow.map((s) => el("div", {class: "straggler", "data-node": s.node, "data-rank": String(s.rank)},
                                             el("span", {class: "rank", text: `rank ${s.rank} on ${s.node}`}),
                                             el("span", {text: ": " + stragglerText(s).replace(/^rank \d+ on [^:]+: /, "")}))));
  }
  const rb = $("#run-recoveries");
  const rec = r.recoveries || [];
  rb.classList.toggle("hidden", !rec.length);
  if (rec.length) {
    rb.replaceChildren(el("div", {class: "recovery-who", text: `Went on after losing ${(r.lost || []).join(", ")}:`}),
                       ...rec.map((a) => el("div", {class: "recovery", "data-lost": a.lost.join(" ")},
                                            el("span", {text: `${when(a.at)}: ${a.lost.join(", ")} lost; attempt ${a.number} on ${a.nodes.join(", ")}`}))));
  }
  fillSelect($("#l-node"), r.nodes || []);
}

/* -- a run's stacks: the diagnosis's groups (largest first, then the odd ranks), then every rank's threads -- */
function frameLines(frames) {
  return (frames || []).map((f) => `  File "${f.file}", line ${f.line}, in ${f.function}` + (f.code ? `\n    ${f.code.trim()}` : "")).join("\n");
}
function renderGroups(diagnosis, box, when) {
  $("#stacks-note").textContent = when ? `(${when})` : "";
  const kids = [el("div", {class: "summary", text: diagnosis.summary})];
  diagnosis.groups.forEach((g, i) => {
    kids.push(el("div", {class: `group ${i ? "odd" : "most"}`, "data-ranks": g.ranks.join(" ")},
      el("span", {class: "who", text: g.ranks.join(", ")}), document.createTextNode(` ${g.where}`),
      el("pre", {text: frameLines(g.frames)})));
  });
  box.replaceChildren(...kids);
}
function renderStacks(data) {
  const box = $("#stacks");
  renderGroups(data.diagnosis, box, data.saved ? "saved at the stall" : `taken ${when(Date.now() / 1000)}`);
  for (const s of data.stacks) {
    const text = s.threads.map((t) => `thread ${t.name}:\n${frameLines(t.frames)}`).join("\n");
    box.append(el("details", {class: "rank", "data-rank": `${s.node}/${s.rank}`},
      el("summary", {text: `${s.node}/${s.rank} (pid ${s.pid})`}), el("pre", {text})));
  }
  for (const [n, why] of Object.entries(data.unreachable || {})) box.append(el("div", {class: "error", text: `${n}: ${why}`}));
}
async function takeStacks() {
  if (!S.run) return;
  const run = S.run, btn = $("#stacks-take");
  btn.disabled = true; $("#stacks-note").textContent = "(taking…)";
  try {
    const data = await post(`/api/runs/${encodeURIComponent(run)}/stacks`);
    if (S.run === run) { S.stacksTaken = true; renderStacks(data); }
  } catch (e) { $("#stacks-note").textContent = ""; toast(`stacks of ${run}: ${e.message}`, true); }
  finally { btn.disabled = false; }
}
/* -- "Profile 3 steps": every rank's trace (higgsfield profile), each rank's shares, the merged timeline linked -- */
async function takeProfile() {
  if (!S.run) return;
  const run = S.run, btn = $("#profile-take"), box = $("#profile");
  btn.disabled = true; $("#profile-note").textContent = "(profiling…)";
  try {
    const data = await post(`/api/runs/${encodeURIComponent(run)}/profile`);
    if (S.run !== run) return;
    box.replaceChildren();
    for (const line of data.ranks) box.append(el("div", {class: "mono small"}, line));
    for (const who of data.missing) box.append(el("div", {class: "muted small"}, `${who}: no trace in time`));
    if (data.merged) {
      const a = el("a", {href: `/api/runs/${encodeURIComponent(run)}/profiles/${data.stamp}/merged.trace.json`},
                   "merged timeline (open it in ui.perfetto.dev)");
      box.append(el("div", {}, a));
    }
    $("#profile-note").textContent = `(${data.dir})`;
  } catch (e) { $("#profile-note").textContent = ""; toast(`profile of ${run}: ${e.message}`, true); }
  finally { btn.disabled = false; }
}
function openRun(run) {
  if (S.runSource) { S.runSource.close(); S.runSource = null; }
  S.run = run; S.lines = []; S.shown = 0; S.points = []; S.skipped = 0; S.drawn = false; S.stacksTaken = false;
  $("#stacks").replaceChildren(); $("#stacks-note").textContent = "";
  $("#profile").replaceChildren(); $("#profile-note").textContent = "";
  if (S.drawTimer) { clearTimeout(S.drawTimer); S.drawTimer = null; }
  $("#log").replaceChildren(); destroyCharts(); updatePointsLabel(); updateSkipped();
  if (!run) return;
  renderRunHead();
  const src = new EventSource(`/api/runs/${encodeURIComponent(run)}/events`);
  S.runSource = src;
  src.addEventListener("meta", () => { S.lines = []; S.points = []; S.skipped = 0; $("#log").replaceChildren(); updateSkipped(); });
  src.addEventListener("lines", (e) => onLines(JSON.parse(e.data)));
  src.addEventListener("points", (e) => onPoints(JSON.parse(e.data)));
  src.addEventListener("skipped", (e) => { S.skipped = Number(JSON.parse(e.data).count) || 0; updateSkipped(); });
  src.addEventListener("error", (e) => {
    if (e.data) { appendNotice(JSON.parse(e.data)); return; }
    // refused (an unknown run) or the server went away: the browser gives up on a non-200; try again
    if (src.readyState === EventSource.CLOSED) setTimeout(() => { if (S.runSource === src) { S.run = null; openRun(run); } }, 2000);
  });
  src.addEventListener("logs_end", () => appendNotice("(the run's logs ended)"));
  src.addEventListener("reset", () => { src.close(); if (S.run === run) { S.run = null; openRun(run); } });
}
function appendNotice(text) {
  onLines([["", NOTICE, text, Date.now() / 1000]]);
}
function lineMatches(l) {
  const n = $("#l-node").value, k = $("#l-rank").value, q = $("#l-search").value.toLowerCase();
  return (!n || l[0] === n) && (!k || String(l[1]) === k) && (!q || l[2].toLowerCase().includes(q));
}
function lineEl(l) {
  const cls = l[1] === NOTICE ? "line notice" : l[1] < 0 ? "line launcher" : `line r${((l[1] % 6) + 6) % 6}`;
  return el("div", {class: cls}, el("span", {class: "who", text: l[0] ? who(l) : "higgsfield"}), document.createTextNode(l[2]));
}
function onLines(batch) {
  const ranks = new Set([...$("#l-rank").options].map((o) => o.value));
  for (const l of batch) {
    S.lines.push(l);
    if (l[1] >= 0 && !ranks.has(String(l[1]))) { ranks.add(String(l[1])); $("#l-rank").append(el("option", {value: String(l[1]), text: String(l[1])})); }
  }
  if (S.lines.length > MAX_LINES) S.lines.splice(0, S.lines.length - MAX_LINES);
  if (S.follow) renderNewLines(batch);
  updateLineCount();
}
function renderNewLines(batch) {
  const log = $("#log");
  const frag = document.createDocumentFragment();
  for (const l of batch) if (lineMatches(l)) frag.append(lineEl(l));
  log.append(frag);
  while (log.childElementCount > MAX_DOM_LINES) log.firstElementChild.remove();
  if (S.follow) log.scrollTop = log.scrollHeight;
}
function rerenderLines() {
  $("#log").replaceChildren();
  renderNewLines(S.lines.filter(lineMatches).slice(-MAX_DOM_LINES));
  updateLineCount();
}
function updateLineCount() {
  $("#l-count").textContent = `${S.lines.length} line(s)` + (S.follow ? "" : " — paused");
}

/* -- curves -------------------------------------------------------------------------------- */
const CURVES = [
  {key: "loss", title: "loss", color: "#d9480f"},
  {key: "tokens_per_s", title: "tokens/s", color: "#1971c2"},
  {key: "lr", title: "learning rate", color: "#2f9e44"},
  {key: "mfu", title: "MFU %", color: "#9c36b5", scale: 100},
  {key: "peak_memory_gib", title: "memory GiB", color: "#e67700"},
  {key: "cross_node_bytes", title: "cross-node MB / step", color: "#0c8599", scale: 1e-6},   /* DiLoCo's outer steps */
  {key: "comm_s", title: "communication s / step", color: "#5f3dc4"},
];
/* uPlot is loaded on the first run page only: the runs table paints without parsing it */
let uplotReady = null;
function loadUPlot() {
  if (!uplotReady) {
    uplotReady = new Promise((resolve, reject) => {
      const css = el("link", {rel: "stylesheet", href: "/static/vendor/uPlot.min.css"});
      const js = el("script", {src: "/static/vendor/uPlot.iife.min.js"});
      js.onload = resolve; js.onerror = reject;
      document.head.append(css, js);
    });
  }
  return uplotReady;
}
function destroyCharts() { for (const c of S.charts) c.plot.destroy(); S.charts = []; $("#charts").replaceChildren(); }
const DRAW_EVERY_MS = 250;   // a run that steps 50 times a second redraws its curves 4 times a second
function onPoints(points) {
  for (const p of points) S.points.push(p);
  if (!S.drawTimer) S.drawTimer = setTimeout(drawCurves, S.drawn ? DRAW_EVERY_MS : 0);
}
function drawCurves() {
  S.drawTimer = null; S.drawn = true;
  if (typeof uPlot === "undefined") { loadUPlot().then(drawCurves); updatePointsLabel(); return; }
  const byStep = new Map();
  for (const p of S.points) byStep.set(p.step, p);   // a restarted worker repeats steps: the last one counts
  const steps = [...byStep.keys()].sort((a, b) => a - b);
  const rows = steps.map((s) => byStep.get(s));
  for (const c of CURVES) {
    const ys = rows.map((p) => p[c.key] == null ? null : p[c.key] * (c.scale || 1));
    if (!ys.some((y) => y != null)) continue;
    let chart = S.charts.find((x) => x.key === c.key);
    if (!chart) {
      const box = el("div", {class: "chart", "data-curve": c.key}, el("div", {class: "chart-title", text: c.title}));
      $("#charts").append(box);
      const width = Math.max(280, Math.floor(($("#charts").clientWidth - 24) / 3) - 14);   // 3 a row: gaps, padding
      const plot = new uPlot({width, height: 180, legend: {show: false}, cursor: {drag: {x: false, y: false}},
                              scales: {x: {time: false}},
                              axes: [{label: "step", size: 36}, {size: 56, values: (u, vals) => vals.map(si)}],
                              series: [{}, {stroke: c.color, width: 2, spanGaps: true}]}, [[], []], box);
      chart = {key: c.key, plot, box};
      S.charts.push(chart);
    }
    chart.plot.setData([steps, ys]);
    chart.box.dataset.points = String(steps.length);
  }
  updatePointsLabel();
}
function updatePointsLabel() {
  const n = new Set(S.points.map((p) => p.step)).size;
  const last = S.points[S.points.length - 1];
  const label = $("#points");
  label.dataset.points = String(n);
  label.textContent = n ? `${n} step(s); last: step ${last.step}, loss ${last.loss == null ? "–" : Number(last.loss).toFixed(4)}` : "no steps yet";
}

/* lines of the run's metrics file that were not a step's metrics: said, small, next to the curves' title */
function updateSkipped() {
  const n = S.skipped || 0, label = $("#skipped");
  label.dataset.skipped = String(n);
  label.textContent = n ? `${n} line${n === 1 ? "" : "s"} skipped (not a metrics record)` : "";
  label.classList.toggle("hidden", !n);
}

/* -- nodes ------------------------------------------------------------------------------------ */
function spark(values, color, max = 100) {
  const w = 120, h = 28, ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", w); svg.setAttribute("height", h); svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  svg.classList.add("spark");
  const pts = values.map((v, i) => v == null ? null : [values.length < 2 ? w : (i * w) / (values.length - 1), h - 1 - (Math.min(v, max) / max) * (h - 2)]).filter(Boolean);
  const line = document.createElementNS(ns, "polyline");
  line.setAttribute("points", pts.map((p) => p.map((x) => x.toFixed(1)).join(",")).join(" "));
  line.setAttribute("fill", "none"); line.setAttribute("stroke", color); line.setAttribute("stroke-width", "1.5");
  svg.append(line);
  return svg;
}
function meter(label, value, text, hist, color) {
  return el("div", {class: "meter"},
    el("span", {class: "k", text: label}),
    el("span", {class: "bar"}, el("span", {class: "fill", style: `width:${Math.max(0, Math.min(100, value || 0)).toFixed(0)}%`})),
    el("span", {class: "v", text}),
    hist ? spark(hist, color) : null);
}
function renderNodes() {
  const box = $("#nodes");
  const frag = document.createDocumentFragment();
  for (const n of S.nodes) {
    const s = n.sample || {};
    const hist = n.history || [];
    const card = el("div", {class: `node n-${n.state}`, "data-node": n.name});
    card.append(el("div", {class: "node-head"},
      el("span", {class: "name", text: n.name}), el("span", {class: "host muted", text: n.host}),
      el("span", {class: `node-state ns-${n.state}`, title: n.reason || "",
                  text: n.label || (n.state === "up" ? "up" : n.state === "down" ? "not answering" : "connecting")})));
    if (n.state !== "up" && n.reason) card.append(el("div", {class: "reason", text: `${n.reason} (since ${when(n.since)})`}));
    const drift = n.drift || [];
    const fab = n.fabric || null;
    if (n.state === "down" || drift.length || (fab && fab.slow)) {
      // an unhealthy node: a run passes it over (run --nodes K, --preflight) or refuses it (drift)
      card.classList.add("unhealthy");
      const marks = el("div", {class: "health"});
      if (n.state === "down") marks.append(el("span", {class: "mark", text: "unreachable"}));
      if (drift.length) {
        marks.append(el("span", {class: "mark", text: "drifted", title: drift.join("\n")}));
        for (const line of drift) marks.append(el("div", {class: "drift-line", text: line}));
      }
      if (fab && fab.slow) {
        marks.append(el("span", {class: "mark mark-slow", text: "slow in the last preflight", title: fab.slow}));
        marks.append(el("div", {class: "drift-line", text: fab.slow}));
      }
      card.append(marks);
    }
    if (fab) card.append(fabricLine(fab));
    if (n.sample) {
      const memPct = s.mem_total ? 100 * s.mem_used / s.mem_total : null;
      const diskPct = s.disk_total ? 100 * s.disk_used / s.disk_total : null;
      card.append(
        meter("CPU", s.cpu_percent, `${pct(s.cpu_percent)} of ${s.cpu_count} cores`, hist.map((h) => h[1]), "#1971c2"),
        meter("memory", memPct, used(s.mem_used, s.mem_total), hist.map((h) => h[2]), "#2f9e44"));
      if (s.disk_total != null) card.append(meter("disk", diskPct, used(s.disk_used, s.disk_total), null));
      const gpus = s.gpus || [];
      if (gpus.length) {
        const t = el("table", {class: "gpus"}, el("tr", {}, ...["GPU", "util", "memory", "temp", ""].map((h) => el("th", {text: h}))));
        for (const g of gpus) {
          t.append(el("tr", {}, el("td", {text: `${g.index} ${g.name}`}), el("td", {text: pct(g.util_percent)}),
            el("td", {text: g.mem_total_mib ? `${(g.mem_used_mib / 1024).toFixed(1)} / ${(g.mem_total_mib / 1024).toFixed(0)} GiB` : "–"}),
            el("td", {text: g.temperature_c == null ? "–" : `${g.temperature_c}°C`}), el("td", {})));
        }
        card.append(t, meter("GPU avg", null, "", hist.map((h) => h[3]), "#9c36b5"));
      } else {
        card.append(el("div", {class: "muted small", text: n.note || "no GPUs (nvidia-smi not found): CPU slots"}));
      }
    }
    const q = n.queue || [];
    const holds = q.filter((e) => e.slots), waits = q.filter((e) => !e.slots);
    const ql = el("div", {class: "queue-list"}, el("div", {class: "k", text: "slots"}));
    if (!q.length) ql.append(el("div", {class: "muted", text: "idle"}));
    for (const e of holds) ql.append(el("div", {class: "holder"}, runLink(e), document.createTextNode(` holds ${held(e)}`)));
    waits.forEach((e, i) => ql.append(el("div", {class: "waiter"}, document.createTextNode(`#${i + 1} `), runLink(e), document.createTextNode(` waits for ${wanted(e)}`))));
    card.append(ql);
    frag.append(card);
  }
  box.replaceChildren(frag);
}
function gbps(v) { return v == null ? "–" : `${v.toPrecision(3)} GB/s`; }
function fabricLine(f) {
  // the node's figures from the last fabric test (doctor --fabric / run --preflight), kept on the nodes
  const gpu = f.gpu === "n/a" ? "GPU n/a" : f.gpu_ok ? "GPU ok" : `GPU: ${f.gpu}`;
  return el("div", {class: `fabric${f.slow ? " bad" : ""}`, title: `${f.run} (${f.backend}, ${f.nodes} nodes)`},
    el("span", {class: "k", text: "fabric"}),
    el("span", {class: "fab-busbw", text: ` busbw ${gbps(f.busbw_gbps)}`}),
    el("span", {class: "fab-link", text: ` · best link ${gbps(f.link_gbps)}`}),
    el("span", {class: "fab-write", text: ` · write ${f.write_mbps == null ? "–" : `${f.write_mbps.toFixed(0)} MB/s`}`}),
    el("span", {class: `fab-gpu${f.gpu_ok ? "" : " bad"}`, text: ` · ${gpu}`}),
    el("span", {class: "fab-at muted", text: ` · ${f.at ? when(f.at) : "?"}`}));
}
// A queue entry (higgsfield.contract.feed.QueueEntry): an SSH node's names its slots and how many it wants;
// a Slurm node's holds the whole node (no slots counted: []) and waits for an allocation (no count).
function held(e) { return e.slots.length ? e.slots.join(", ") : "the node"; }
function wanted(e) {
  if (e.want != null) return e.want;
  const r = e.project === S.project ? S.runs.find((x) => x.run === e.run) : null;
  return `an allocation (${(r && r.reason) || "pending"})`;
}
function runLink(e) {
  if (e.project !== S.project) return el("span", {class: "muted", text: `${e.project}/${e.run}`});
  return el("a", {href: `#run/${encodeURIComponent(e.run)}`, text: e.run});
}
function onNodes(data) {
  S.nodes = data.nodes;
  if (S.view === "nodes") renderNodes();
  const down = S.nodes.filter((n) => n.state === "down").length;
  const drifted = S.nodes.filter((n) => (n.drift || []).length).length;
  const slow = S.nodes.filter((n) => n.fabric && n.fabric.slow).length;
  const bad = [down ? `${down} down` : "", drifted ? `${drifted} drifted` : "", slow ? `${slow} slow` : ""]
    .filter(Boolean).join(", ");
  $("#nav-nodes").textContent = bad ? `Nodes (${bad})` : "Nodes";
}

/* -- start ---------------------------------------------------------------------------------- */
function connect() {
  const src = new EventSource("/api/events");
  const live = $("#live");
  src.addEventListener("open", () => { live.textContent = "live"; live.className = "live on"; });
  src.addEventListener("error", () => {
    live.textContent = "reconnecting"; live.className = "live off";
    // refused (429: too many streams from this address) or a non-200: the browser gives up; try again
    if (src.readyState === EventSource.CLOSED) setTimeout(connect, 3000);
  });
  src.addEventListener("runs", (e) => onRuns(JSON.parse(e.data)));
  src.addEventListener("nodes", (e) => onNodes(JSON.parse(e.data)));
}
async function main() {
  connect();   // the state stream and the session (the CSRF token) at once: the table paints sooner
  const r = await fetch("/api/session");
  if (!r.ok) { document.body.textContent = await r.text(); return; }
  const s = await r.json();
  S.csrf = s.csrf; S.project = s.project;
  $("#project").textContent = s.project;
  $("#project").title = `runs on ${s.where}`;
  $("#where").textContent = s.where;
  fillSelect($("#f-state"), s.states);   // the run states of higgsfield.contract.states.STATES
  document.title = `higgsfield · ${s.project}`;
  $("#f-exp").onchange = $("#f-state").onchange = renderRuns;
  $("#l-node").onchange = $("#l-rank").onchange = rerenderLines;
  $("#l-search").oninput = rerenderLines;
  $("#l-follow").onclick = () => {
    S.follow = !S.follow;
    $("#l-follow").textContent = S.follow ? "Following" : "Paused";
    $("#l-follow").classList.toggle("on", S.follow);
    if (S.follow) rerenderLines(); else updateLineCount();
  };
  $("#new-run").onclick = () => openForm($("#new-exp").value, null);
  $("#run-kill").onclick = () => S.run && kill(S.run);
  $("#stacks-take").onclick = takeStacks;
  $("#profile-take").onclick = takeProfile;
  $("#run-rerun").onclick = () => { const r = currentRun(); if (r) openForm(r.experiment, r.run); };
  $("#form-cancel").onclick = () => $("#form-dialog").close();
  $("#form-check").onclick = () => submitForm(true);
  $("#form-start").onclick = () => submitForm(false);
  window.addEventListener("hashchange", route);
  route();
}
main();
