// voice_agent call viewer: the recent calls (/calls/view) and one call (/calls/{id}/view),
// built from GET /calls and GET /calls/{id}. No innerHTML: every value goes in as text.
"use strict";

const $ = (id) => document.getElementById(id);
const token = new URLSearchParams(location.search).get("token");
const setStatus = (text) => { $("status").textContent = text; };

// A path with query parameters (empty ones left out) and the page's own ?token= passed on.
function withToken(path, params = {}) {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== "" && value != null) query.set(key, value);
  }
  if (token) query.set("token", token);
  const text = query.toString();
  return text ? `${path}?${text}` : path;
}

// An element with properties and children (strings become text nodes; null and false are skipped).
function el(tag, props, ...children) {
  const node = Object.assign(document.createElement(tag), props || {});
  node.append(...children.flat(Infinity).filter((c) => c != null && c !== false && c !== ""));
  return node;
}

async function getJson(path) {
  const res = await fetch(path, { cache: "no-store" });
  const body = await res.json().catch(() => undefined);
  if (!res.ok) throw new Error(`HTTP ${res.status} ${body?.error || res.statusText}`.trim());
  if (body === undefined) throw new Error(`${path.split("?")[0]} did not answer JSON`);
  return body;
}

const show = (value) => (typeof value === "string" ? value : JSON.stringify(value));
const clip = (text, n) => (text.length > n ? `${text.slice(0, n - 1)}\u2026` : text);
const when = (iso) => (iso ? new Date(iso).toLocaleString() : "\u2013");
const clock = (t) => `${Math.floor(t / 60)}:${(t % 60).toFixed(1).padStart(4, "0")}`;
const callLink = (id) => withToken(`/calls/${encodeURIComponent(id)}/view`);
const outcomeOf = (c) => c.outcome ?? c.end_reason ?? (c.ended_at ? "" : "live");

function length(call) {
  if (!call.started_at) return "\u2013";
  if (!call.ended_at) return "live";
  const s = (Date.parse(call.ended_at) - Date.parse(call.started_at)) / 1000;
  return s < 60 ? `${s.toFixed(1)} s` : `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
}

function badge(text, kind = "") {
  return el("span", { className: `badge ${kind}`.trim(), textContent: text });
}

// ---- the list of calls -------------------------------------------------------------------

const PAGE_SIZE = 50;
const FILTERS = ["agent", "outcome", "q"];

function addOptions(select, names) {
  const have = new Set([...select.options].map((o) => o.value));
  for (const name of names) if (name && !have.has(name)) select.append(new Option(name, name));
}

async function loadAgents() {
  try {
    const info = await getJson(withToken("/agents"));
    addOptions($("agent"), (info.agents || []).map((a) => a.name));
  } catch { /* the calls' own agents fill the list */ }
}

// The older API answers a plain list of every recent call: page and filter it here.
function pageOf(body, filters, offset) {
  if (!Array.isArray(body)) {
    const calls = body.calls || [];
    return { calls, total: body.total ?? calls.length, next: body.next_offset ?? null };
  }
  const q = filters.q.toLowerCase();
  const kept = body.filter((c) => (!filters.agent || c.agent === filters.agent)
    && (!filters.outcome || outcomeOf(c) === filters.outcome)
    && (!q || JSON.stringify(c).toLowerCase().includes(q)));
  const next = offset + PAGE_SIZE < kept.length ? offset + PAGE_SIZE : null;
  return { calls: kept.slice(offset, offset + PAGE_SIZE), total: kept.length, next };
}

function callRow(c) {
  const outcome = outcomeOf(c);
  const turns = Array.isArray(c.turns) ? c.turns.length : c.turns;
  return el("tr", {},
    el("td", {}, el("time", { dateTime: c.started_at || "", textContent: when(c.started_at) })),
    el("td", {}, el("a", { href: callLink(c.call_id) }, el("code", { textContent: c.call_id }))),
    el("td", { textContent: c.agent ?? "" }),
    el("td", { textContent: c.transport ?? "" }),
    el("td", { textContent: length(c) }),
    el("td", { title: c.end_reason && c.end_reason !== outcome ? c.end_reason : "" },
      c.ended_at ? outcome : badge("live", "live")),
    el("td", { className: "num", textContent: turns ?? "\u2013" }),
    el("td", { className: "preview", textContent: clip(c.preview || "", 120) }));
}

async function loadList() {
  const params = new URLSearchParams(location.search);
  const filters = Object.fromEntries(FILTERS.map((k) => [k, params.get(k) || ""]));
  const offset = Math.max(0, parseInt(params.get("offset") || "0", 10) || 0);
  addOptions($("agent"), [filters.agent]);
  for (const key of FILTERS) $(key).value = filters[key];
  setStatus("loading");
  let page;
  try {
    page = pageOf(await getJson(withToken("/calls", { limit: PAGE_SIZE, offset, ...filters })),
      filters, offset);
  } catch (err) {
    return setStatus(`error: ${err.message}`);
  }
  const body = $("calls").tBodies[0];
  body.replaceChildren(...page.calls.map(callRow));
  if (!page.calls.length) {
    body.append(el("tr", {}, el("td", { colSpan: 8, className: "empty",
      textContent: FILTERS.some((k) => filters[k]) ? "No call matches." : "No calls yet." })));
  }
  addOptions($("agent"), page.calls.map((c) => c.agent));
  const outcomes = new Set([...$("outcomes").options].map((o) => o.value));
  page.calls.forEach((c) => outcomes.add(outcomeOf(c)));
  $("outcomes").replaceChildren(...[...outcomes].filter(Boolean).sort().map((o) => new Option(o)));
  const shown = page.calls.length ? `${offset + 1}\u2013${offset + page.calls.length}` : "0";
  $("count").textContent = `(${page.total} in all)`;
  $("page-info").textContent = `${shown} of ${page.total}`;
  $("prev").disabled = offset === 0;
  $("next").disabled = page.next == null;
  $("prev").onclick = () => go({ offset: Math.max(0, offset - PAGE_SIZE) || "" });
  $("next").onclick = () => go({ offset: page.next });
  setStatus(`${page.total} call${page.total === 1 ? "" : "s"}`);
  document.body.dataset.loaded = "true";
}

// Filters and paging live in the page's URL (with the token): back, forward and links work.
function go(changes) {
  const params = new URLSearchParams(location.search);
  for (const [key, value] of Object.entries(changes)) {
    if (value === "" || value == null) params.delete(key);
    else params.set(key, value);
  }
  const query = params.toString();
  history.pushState(null, "", query ? `${location.pathname}?${query}` : location.pathname);
  loadList();
}

function listPage() {
  $("home").href = withToken("/");
  $("filters").addEventListener("submit", (e) => {
    e.preventDefault();
    go({ ...Object.fromEntries(FILTERS.map((k) => [k, $(k).value.trim()])), offset: "" });
  });
  $("filters").addEventListener("reset", (e) => {
    e.preventDefault();
    go({ agent: "", outcome: "", q: "", offset: "" });
  });
  window.addEventListener("popstate", loadList);
  loadAgents();
  loadList();
}

// ---- one call: the timeline --------------------------------------------------------------

// Events after which the agent may speak: a reply is shown after the last of these before it.
const AGENT_SIDE = new Set(["call_started", "event", "page", "route", "intent_match",
  "state_change", "tool_call", "trigger", "override", "respond", "transition", "llm_actions",
  "turn_metrics", "user_utterance", "agent_utterance"]);
const SKIPPED = new Set(["caller_speech_started", "respond", "llm_actions"]);

// The reply as generated: the words the caller heard, then the rest struck through.
// `committed` is the generated text cut to the heard words (null: none heard).
function replyText(e) {
  const generated = e.generated || "";
  const committed = e.committed ?? null;
  const del = (text) => el("del", { title: "generated, never heard by the caller" }, text);
  if (!generated) return [committed || ""];
  if (committed === null || !committed.trim()) return [del(generated)];
  if (committed === generated) return [generated];
  const count = committed.split(/\s+/).filter(Boolean).length;
  let end = 0;
  let seen = 0;
  for (const m of generated.matchAll(/\S+/g)) {
    if (seen === count) break;
    seen += 1;
    end = m.index + m[0].length;
  }
  const rest = generated.slice(end).trim();
  return [generated.slice(0, end), rest && " ", rest && del(rest)];
}

function details(summary, parts) {
  return el("details", {}, el("summary", {}, summary),
    ...parts.map(([label, value]) => el("div", { className: "detail-part" },
      el("span", { className: "part-label", textContent: label }),
      el("pre", { textContent: JSON.stringify(value, null, 2) }))));
}

function value(v) {
  return v == null
    ? el("span", { className: "unset", textContent: "unset" })
    : el("code", { textContent: clip(show(v), 200) });
}

const who = (...parts) => el("span", { className: "who" }, ...parts);

function meta(kind, label, ...rest) {
  return { cls: `meta ${kind}`, nodes: [el("strong", { textContent: label }), ...rest] };
}

// One audit event as a timeline row: {cls, nodes}, or null to leave it out.
function row(e) {
  switch (e.type) {
    case "user_utterance":
      return { cls: "bubble user", nodes: [who("Caller"), e.text] };
    case "user_utterance_dropped":
      return {
        cls: "bubble user dropped",
        nodes: [who("Caller \u00b7 dropped ", badge(e.reason || "dropped", "warn")),
          e.text ? e.text : el("span", { className: "unset", textContent: "(no words)" })],
      };
    case "agent_utterance": {
      const flag = e.committed == null || !String(e.committed).trim()
        ? badge("never heard", "bad") : e.interrupted ? badge("interrupted", "warn") : null;
      return {
        cls: "bubble agent",
        nodes: [who("Agent", flag && " ", flag), ...replyText(e)],
      };
    }
    case "barge_in":
      return meta("barge", "Barge-in", ` \u2013 the agent stopped ${Math.round(e.latency_ms)} ms `
        + "after the caller began speaking");
    case "false_interruption":
      return meta("barge", "False interruption", ` (${e.reason}): the agent went on`,
        e.resumed ? ` with \u201c${clip(e.resumed, 80)}\u201d` : "");
    case "tool_call": {
      const failed = e.error != null;
      const summary = [el("strong", { textContent: "Tool" }),
        ` ${e.name}(${clip(JSON.stringify(e.arguments ?? {}), 60)}) `,
        failed ? badge("error", "bad") : badge("ok", "ok"),
        e.duration_s != null ? ` ${Math.round(e.duration_s * 1000)} ms` : ""];
      const parts = [["arguments", e.arguments ?? {}],
        failed ? ["error", e.error] : ["result", e.result]];
      return { cls: "meta tool", nodes: [details(summary, parts)] };
    }
    case "state_change":
      return meta("state", "State", ` \u00b7 ${e.source}`, el("ul", { className: "diff" },
        Object.entries(e.diff || {}).map(([key, change]) => el("li", {},
          el("code", { className: "key", textContent: key }), ": ", value(change.old), " \u2192 ",
          value(change.new)))));
    case "trigger":
      return meta("trigger", "Trigger", ` ${e.function} on ${e.kind}`,
        e.event ? ` (${e.event})` : "");
    case "override":
      return meta("trigger", "Override", ` \u2192 ${e.action} `, value(e.inputs ?? {}));
    case "intent_match":
      return meta("flow", "Intent", ` ${e.intent ?? "none"}`,
        e.confidence != null ? ` (${e.confidence})` : "",
        Object.keys(e.parameters || {}).length ? [" ", value(e.parameters)] : []);
    case "route":
      return meta("flow", "Route", `${e.intent ? ` on ${e.intent}` : ""} \u2192 `
        + `${e.transfer ? `transfer to ${e.transfer}` : e.goto ?? "(stay)"}`);
    case "page":
      return meta("flow", "Page", ` \u2192 ${e.page}`);
    case "transition":
      return meta("transition", "Transfer", ` ${e.source} \u2192 ${e.target}`,
        Object.keys(e.args || {}).length ? [" ", value(e.args)] : [],
        e.context != null ? ` (context: ${e.context})` : "");
    case "event":
      return meta("event", "Event", ` ${e.name}`,
        Object.keys(e.data || {}).length ? [" ", value(e.data)] : []);
    case "call_started":
      return meta("event", "Call started", ` with agent ${e.agent}`);
    case "call_ended":
      return meta("event", "Call ended", `: ${e.reason}`);
    case "turn_metrics": {
      const ms = e.speech_end_to_first_audio_ms;
      const text = `Turn ${e.turn_no}: ${ms != null ? `${Math.round(ms)} ms` : "\u2013"}`;
      return meta("metrics", "", el("a", { href: `#turn-${e.turn_no}` }, text, " to first audio"));
    }
    case "error":
      return meta("error", "Error", ` in ${e.where}: ${e.message}`);
    default: {
      const { type, t, seq, at, shownT, ...rest } = e; // the rest as recorded
      const name = el("strong", { textContent: type });
      return { cls: "meta other", nodes: [details(name, [["data", rest]])] };
    }
  }
}

// Replies are audited when committed (played out, or cut): each goes back to where it began,
// `started_t` when the server gives it, or else after the last agent-side event before it.
function ordered(audit) {
  const events = audit.map((e, seq) => ({ ...e, seq, at: seq, shownT: e.t }));
  let anchor = null;
  let turnNo = 0;
  for (const e of events) {
    if (e.type === "turn_metrics") e.turn_no = ++turnNo;
    if (e.type !== "agent_utterance") {
      if (AGENT_SIDE.has(e.type)) anchor = e;
      continue;
    }
    let before = anchor;
    if (typeof e.started_t === "number") {
      before = events.filter((o) => o.t <= e.started_t && o.seq < e.seq).pop() || null;
    }
    if (before) {
      e.at = before.seq + 0.5 + e.seq * 1e-7;
      e.shownT = typeof e.started_t === "number" ? e.started_t : before.t;
    }
    anchor = e;
  }
  return events.sort((a, b) => a.at - b.at);
}

function renderTimeline(call) {
  const items = [];
  for (const e of ordered(call.audit || [])) {
    if (SKIPPED.has(e.type)) continue;
    const r = row(e);
    if (!r) continue;
    const time = el("span", { className: "t", textContent: clock(e.shownT || 0) });
    if (e.type === "agent_utterance") time.title = `committed at ${clock(e.t)}`;
    items.push(el("li", { className: String(e.type || "").replace(/_/g, "-") }, time,
      el("div", { className: r.cls }, r.nodes)));
  }
  if (!items.length) items.push(el("li", { className: "empty" }, "Nothing recorded yet."));
  $("timeline").replaceChildren(...items);
}

// ---- one call: the latency waterfall -----------------------------------------------------

const STEPS = [
  ["end_of_turn_ms", "end of turn"],
  ["stt_final_ms", "STT final"],
  ["first_token_ms", "LLM first token"],
  ["first_tts_audio_ms", "TTS first audio"],
  ["first_audio_sent_ms", "first audio sent"],
];

function track(bar) {
  const div = el("div", { className: "track" }, bar);
  div.setAttribute("aria-hidden", "true"); // the numbers beside it say the same
  return div;
}

function renderWaterfall(turns) {
  const rows = turns.map((t) => {
    const base = typeof t.speech_end_ms === "number" ? t.speech_end_ms : t.user_turn_ms;
    const steps = typeof base !== "number" ? [] : STEPS
      .map(([k, label], step) => [label, typeof t[k] === "number" ? t[k] - base : null, step])
      .filter(([, ms]) => ms !== null);
    return { t, base, steps };
  });
  const scale = Math.max(1, ...rows.flatMap((r) => r.steps.map(([, ms]) => ms)));
  const pct = (ms) => `${(100 * Math.max(0, ms)) / scale}%`;
  const figures = rows.map(({ t, base, steps }, i) => {
    const total = t.speech_end_to_first_audio_ms;
    const spoke = [t.speech_start_ms, t.speech_end_ms].every((v) => typeof v === "number")
      ? ` \u00b7 the caller spoke ${((t.speech_end_ms - t.speech_start_ms) / 1000).toFixed(1)} s`
      : "";
    let previous = 0;
    const body = steps.map(([label, ms, step]) => {
      const start = Math.min(previous, ms);
      previous = Math.max(previous, ms);
      const bar = el("span", { className: `bar s${step}` });
      bar.style.left = pct(start);
      bar.style.width = pct(ms - start);
      return el("tr", { title: `${label}: ${Math.round(ms)} ms after the speech ended (this step `
          + `${Math.round(ms - start)} ms)` },
        el("th", { scope: "row", className: "step", textContent: label }),
        el("td", { className: "lane" }, track(bar)),
        el("td", { className: "num", textContent: `+${Math.round(ms)}` }));
    });
    const heading = el("h3", { id: `turn-${i + 1}` }, `Turn ${i + 1}: `,
      el("strong", { textContent: total != null ? `${Math.round(total)} ms` : "\u2013" }));
    const note = el("p", { className: "hint", textContent: typeof base === "number"
      ? `speech ended at ${clock(base / 1000)}${spoke}` : "no timings" });
    return el("figure", { className: "turn" }, heading, note,
      body.length ? el("table", { className: "waterfall" }, el("tbody", {}, body)) : null);
  });
  $("waterfall").replaceChildren(...(figures.length ? figures
    : [el("p", { className: "hint", textContent: "No caller turns." })]));
}

// ---- one call: the page ------------------------------------------------------------------

function renderDetails(call) {
  const fields = [
    ["Agent", call.agent], ["Transport", call.transport], ["Started", when(call.started_at)],
    ["Ended", call.ended_at ? when(call.ended_at) : "live"], ["Length", length(call)],
    ["Outcome", call.outcome], ["End reason", call.end_reason],
    ["Turns", (call.turns || []).length],
  ];
  $("details").replaceChildren(...fields.filter(([, v]) => v != null && v !== "")
    .flatMap(([k, v]) => [el("dt", { textContent: k }), el("dd", { textContent: String(v) })]));
  $("state").tBodies[0].replaceChildren(...Object.entries(call.state || {}).map(([k, v]) =>
    el("tr", {}, el("th", { scope: "row", textContent: k }), el("td", {}, value(v)))));
}

async function callPage() {
  const raw = location.pathname.split("/")[2] || "";
  let callId = raw;
  try { callId = decodeURIComponent(raw); } catch { /* a stray %: the id as written */ }
  $("call-id").textContent = callId;
  $("back").href = withToken("/calls/view");
  document.title = `Call ${callId} \u00b7 voice_agent`;
  let call;
  try {
    call = await getJson(withToken(`/calls/${encodeURIComponent(callId)}`));
  } catch (err) {
    return setStatus(`error: ${err.message}`);
  }
  renderDetails(call);
  renderTimeline(call);
  renderWaterfall(call.turns || []);
  setStatus(call.ended_at ? `ended: ${call.end_reason || "call over"}` : "live: reload for more");
  document.body.dataset.loaded = "true";
}

if (document.body.dataset.page === "calls") listPage();
else callPage();
