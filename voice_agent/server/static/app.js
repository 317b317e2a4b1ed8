// voice_agent browser client: WebRTC audio, signalling over /rtc, events on the "events" channel.
"use strict";

const $ = (id) => document.getElementById(id);
const els = {
  agent: $("agent"), description: $("agent-description"), call: $("call"), hangup: $("hangup"),
  status: $("status"), callId: $("call-id"), transcript: $("transcript"),
  state: $("state").tBodies[0], metrics: $("metrics"), remote: $("remote"),
};
const token = new URLSearchParams(location.search).get("token");
const withToken = (path) => (token ? `${path}?token=${encodeURIComponent(token)}` : path);
const GATHER_TIMEOUT_MS = 3000;

let iceServers = [];
let agents = [];
let session = null; // the current or last call: {pc, ws, dc, mic, timer, callId, ended, failed}

const setStatus = (text) => { els.status.textContent = text; };

function setButtons(inCall) {
  els.call.disabled = inCall;
  els.agent.disabled = inCall;
  els.hangup.disabled = !inCall;
  (inCall ? els.hangup : els.call).focus();
}

// ---- agents ------------------------------------------------------------------------------

async function loadAgents() {
  let info;
  try {
    const res = await fetch(withToken("/agents"), { cache: "no-store" });
    if (!res.ok) {
      const body = await res.json().catch(() => ({}));
      throw new Error(`HTTP ${res.status} ${body.error || res.statusText}`.trim());
    }
    info = await res.json();
  } catch (err) {
    els.agent.replaceChildren(new Option("unavailable"));
    return setStatus(`error: ${err.message}`);
  }
  agents = info.agents || [];
  iceServers = info.ice_servers || [];
  els.agent.replaceChildren(...agents.map((a) => {
    const option = new Option(a.name, a.name, false, a.name === info.default);
    option.title = a.description || "";
    return option;
  }));
  els.agent.disabled = agents.length === 0;
  showDescription();
  if (info.webrtc === false) {
    setStatus("unavailable: this server was installed without WebRTC support "
      + "(pip install 'voice_agent[webrtc]')");
  } else if (agents.length === 0) {
    setStatus("error: the server has no agents");
  } else {
    els.call.disabled = false;
  }
}

function showDescription() {
  const found = agents.find((a) => a.name === els.agent.value);
  els.description.textContent = found ? found.description || "" : "";
}

// ---- transcript --------------------------------------------------------------------------

const replies = new Map(); // reply_id -> {li, text, heard}

function addLine(kind) {
  const li = document.createElement("li");
  li.className = kind;
  els.transcript.append(li);
  return li;
}

function scrollTranscript() {
  els.transcript.scrollTop = els.transcript.scrollHeight;
}

function onTranscript(msg) {
  let li = els.transcript.querySelector("li.user.partial");
  const text = (msg.text || "").trim();
  if (!text) {
    if (msg.final && li) li.remove();
    return;
  }
  if (!li) li = addLine("user");
  li.textContent = text;
  li.classList.toggle("partial", !msg.final);
  scrollTranscript();
}

function reply(id) {
  const key = String(id);
  if (!replies.has(key)) {
    const li = addLine("agent");
    li.dataset.replyId = key;
    replies.set(key, { li, text: "", heard: null });
  }
  return replies.get(key);
}

const norm = (word) => word.toLowerCase().replace(/[^\p{L}\p{N}]+/gu, "");

// Where the heard words stop in the full text (an index into it), comparing word by word.
function heardPrefixEnd(full, heard) {
  const said = heard.split(/\s+/).map(norm).filter(Boolean);
  let matched = 0;
  let end = 0;
  for (const m of full.matchAll(/\S+/g)) {
    if (matched >= said.length) break;
    const word = norm(m[0]);
    if (!word) continue;
    if (word !== said[matched]) break;
    matched += 1;
    end = m.index + m[0].length;
  }
  return matched >= said.length && said.length > 0 && !full.slice(end).match(/[\p{L}\p{N}]/u)
    ? full.length : end;
}

function renderReply(r) {
  if (r.heard === null) {
    r.li.textContent = r.text;
    return;
  }
  const full = r.text || r.heard;
  const end = heardPrefixEnd(full, r.heard);
  const rest = full.slice(end).trim();
  r.li.replaceChildren(full.slice(0, end));
  if (rest) {
    const del = document.createElement("del");
    del.title = "not heard by the caller";
    del.textContent = rest;
    r.li.append(end > 0 ? " " : "", del);
  }
}

// ---- state and metrics -------------------------------------------------------------------

const show = (value) => (typeof value === "string" ? value : JSON.stringify(value));

function onState(changes) {
  for (const [key, change] of Object.entries(changes || {})) {
    let row = [...els.state.rows].find((tr) => tr.dataset.key === key);
    if (change.new === undefined) {
      if (row) row.remove();
      continue;
    }
    if (!row) {
      row = els.state.insertRow();
      row.dataset.key = key;
      const th = document.createElement("th");
      th.scope = "row";
      th.textContent = key;
      row.append(th, document.createElement("td"));
    }
    row.cells[1].textContent = show(change.new);
  }
}

// The headline number, then the other timings as offsets from the end of the caller's speech.
function onMetrics(metrics) {
  const MAIN = "speech_end_to_first_audio_ms";
  const main = metrics[MAIN];
  const base = metrics.speech_end_ms;
  const numbers = Object.entries(metrics)
    .filter(([k, v]) => typeof v === "number" && k !== "turn" && k !== MAIN);
  const label = (k) => k.replace(/_ms$/, "").replace(/_/g, " ");
  const detail = document.createElement("span");
  detail.className = "detail";
  detail.textContent = typeof base === "number"
    ? numbers.filter(([, v]) => v > base).map(([k, v]) => `${label(k)} +${Math.round(v - base)}`)
      .join(" \u00b7 ")
    : numbers.map(([k, v]) => `${label(k)} ${Math.round(v)}`).join(" \u00b7 ");
  const li = document.createElement("li");
  li.title = numbers.map(([k, v]) => `${k}: ${v}`).join("\n");
  const turn = document.createElement("strong");
  turn.textContent = `Turn ${metrics.turn ?? els.metrics.children.length + 1}:`;
  li.append(turn, ` ${typeof main === "number" ? `${Math.round(main)} ms` : "\u2013"}`, detail);
  els.metrics.append(li);
}

function onEvent(s, msg) {
  switch (msg.type) {
    case "transcript":
      return onTranscript(msg);
    case "agent_text": {
      const r = reply(msg.reply_id);
      r.text += msg.text || ""; // the pieces carry their own spacing
      renderReply(r);
      return scrollTranscript();
    }
    case "committed": {
      const r = reply(msg.reply_id);
      r.heard = msg.text || "";
      r.li.dataset.committed = "true";
      return renderReply(r);
    }
    case "state":
      return onState(msg.changes);
    case "turn_metrics":
      return onMetrics(msg.metrics || {});
    case "error": // the call goes on unless an `end` or the close follows
      return setStatus(`error: ${msg.message || msg.code}`);
    case "end":
      return finish(s, `ended: ${msg.reason || "call over"}`);
    default: // mark, clear and anything newer
  }
}

// ---- the call ----------------------------------------------------------------------------

// The receive side of the agent's audio, from pc.getStats(): null before it exists.
async function inboundAudio(pc) {
  const stats = await pc.getStats();
  return [...stats.values()].find(
    (r) => r.type === "inbound-rtp" && (r.kind || r.mediaType) === "audio") || null;
}

function iceGathered(pc) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      pc.removeEventListener("icegatheringstatechange", check);
      resolve();
    };
    const check = () => { if (pc.iceGatheringState === "complete") done(); };
    const timer = setTimeout(done, GATHER_TIMEOUT_MS);
    pc.addEventListener("icegatheringstatechange", check);
  });
}

async function call() {
  const s = {
    pc: null, ws: null, dc: null, mic: null, timer: null, callId: null, ended: false, failed: false,
  };
  session = s;
  els.transcript.replaceChildren();
  els.state.replaceChildren();
  els.metrics.replaceChildren();
  replies.clear();
  els.callId.textContent = "\u2013";
  setButtons(true);
  setStatus("connecting");
  try {
    if (!navigator.mediaDevices) throw new Error("the microphone needs HTTPS (or localhost)");
    s.mic = await navigator.mediaDevices.getUserMedia({
      audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true },
    });
    if (s.ended) return s.mic.getTracks().forEach((t) => t.stop()); // hung up meanwhile
    const pc = (s.pc = new RTCPeerConnection({ iceServers }));
    for (const track of s.mic.getAudioTracks()) pc.addTrack(track, s.mic);
    pc.ontrack = (e) => { els.remote.srcObject = e.streams[0] || new MediaStream([e.track]); };
    pc.onconnectionstatechange = () => {
      if (pc.connectionState === "connected") setStatus("in call");
      if (pc.connectionState === "failed") finish(s, "error: the media connection failed");
    };
    s.dc = pc.createDataChannel("events");
    s.dc.onmessage = (e) => {
      if (s.ended) return;
      try { onEvent(s, JSON.parse(e.data)); } catch (err) { console.warn("bad event", err); }
    };
    s.dc.onopen = () => { s.timer = setInterval(() => reportPlayout(s), 1000); };
    await pc.setLocalDescription(await pc.createOffer());
    await iceGathered(pc);
    if (s.ended) return;
    signal(s);
  } catch (err) {
    const denied = err.name === "NotAllowedError";
    finish(s, `error: ${denied ? "microphone access was denied" : err.message}`);
  }
}

function signal(s) {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const ws = (s.ws = new WebSocket(`${scheme}//${location.host}${withToken("/rtc")}`));
  ws.onopen = () => {
    const sdp = s.pc.localDescription.sdp;
    ws.send(JSON.stringify({ type: "offer", sdp, agent: els.agent.value, args: {} }));
  };
  ws.onmessage = async (e) => {
    if (s.ended) return;
    let msg;
    try { msg = JSON.parse(e.data); } catch { return; }
    if (msg.type === "answer") {
      s.callId = msg.call_id || null;
      els.callId.textContent = s.callId || "\u2013";
      try {
        await s.pc.setRemoteDescription({ type: "answer", sdp: msg.sdp });
      } catch (err) {
        finish(s, `error: bad answer from the server (${err.message})`);
      }
    } else if (msg.type === "error") {
      s.failed = true; // the error says more than the `end` and the close that follow it
      setStatus(`error: ${msg.message || msg.code}`);
    } else if (msg.type === "end") {
      finish(s, s.failed ? null : `ended: ${msg.reason || "call over"}`);
    }
  };
  ws.onclose = (e) => {
    if (s.ended) return;
    const why = e.reason || (e.code === 1000 ? "call over" : `connection closed (code ${e.code})`);
    finish(s, s.failed ? null : `ended: ${why}`);
  };
}

async function reportPlayout(s) {
  if (s.ended || !s.dc || s.dc.readyState !== "open") return;
  try {
    const r = await inboundAudio(s.pc);
    if (r?.jitterBufferEmittedCount > 0 && s.dc.readyState === "open") {
      const delay = (1000 * r.jitterBufferDelay) / r.jitterBufferEmittedCount;
      s.dc.send(JSON.stringify({ type: "playout", delay_ms: Math.round(delay * 10) / 10 }));
    }
  } catch { /* the connection is closing */ }
}

// Tidy up after a call: every resource it held, once. `status` null keeps the current status.
function finish(s, status) {
  if (s.ended) return;
  s.ended = true;
  if (status && session === s) setStatus(status);
  clearInterval(s.timer);
  try { s.dc?.close(); } catch { /* already closed */ }
  try { s.pc?.close(); } catch { /* already closed */ }
  s.mic?.getTracks().forEach((t) => t.stop());
  if (s.ws && s.ws.readyState <= WebSocket.OPEN) s.ws.close(1000);
  els.remote.srcObject = null;
  els.transcript.querySelector("li.user.partial")?.remove();
  if (session === s) setButtons(false);
}

function hangup() {
  const s = session;
  if (!s || s.ended) return;
  if (s.ws?.readyState === WebSocket.OPEN) s.ws.send(JSON.stringify({ type: "hangup" }));
  finish(s, "ended: hung up");
}

els.agent.addEventListener("change", showDescription);
els.call.addEventListener("click", call);
els.hangup.addEventListener("click", hangup);
window.addEventListener("pagehide", hangup);

window.voiceAgent = {
  get callId() { return session?.callId ?? null; },
  get pc() { return session?.pc ?? null; },
  async inboundAudioEnergy() {
    try {
      return (await inboundAudio(session.pc))?.totalAudioEnergy || 0;
    } catch {
      return 0; // no call, or closed
    }
  },
};

loadAgents();
