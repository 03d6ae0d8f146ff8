// The playground: plain browser JavaScript against the proxy's OpenAI-compatible routes (same origin).
// Each panel marks its output element with data-state="running" | "done" | "error" when it changes,
// so a person sees what happens and a browser test can wait for it.
"use strict";

const $ = (id) => document.getElementById(id);
const routes = {};            // model id -> its route ("chat", "speech", ...)

function headers(extra = {}) {
  const key = $("api-key").value.trim();
  localStorage.setItem("triton-omni-api-key", key);
  return key ? { Authorization: `Bearer ${key}`, ...extra } : extra;
}

async function api(path, options = {}) {
  const response = await fetch(path, { ...options, headers: headers(options.headers || {}) });
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try { message = (await response.json()).error.message || message; } catch (e) { /* not JSON */ }
    throw new Error(message);
  }
  return response;
}

function setState(element, state, text) {
  element.dataset.state = state;
  element.classList.toggle("error", state === "error");
  if (text !== undefined) element.textContent = text;
}

function status(text) { $("status").textContent = text; }

async function loadModels() {
  try {
    const list = await (await api("/v1/models")).json();
    for (const m of list.data) routes[m.id] = m.route;
    for (const select of document.querySelectorAll("select[data-route]")) {
      const wanted = select.dataset.route.split(" ");
      const models = list.data.filter((m) => wanted.includes(m.route));
      select.replaceChildren(...models.map((m) => new Option(wanted.length > 1 ? `${m.id} (${m.route})` : m.id, m.id)));
      select.closest("section").querySelector("button").disabled = models.length === 0;
      if (models.length === 0) select.replaceChildren(new Option("no model serves this route", ""));
    }
    status(`${list.data.length} models`);
    document.body.dataset.models = "loaded";
  } catch (e) {
    status(`models: ${e.message}`);
    document.body.dataset.models = "error";
  }
}

// Server-sent events from a fetch body: calls onEvent(parsed JSON) for each `data:` line but [DONE].
async function readEvents(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of block.split("\n")) {
        if (line.startsWith("data:")) {
          const data = line.slice(5).trim();
          if (data && data !== "[DONE]") onEvent(JSON.parse(data));
        }
      }
    }
  }
}

async function chat() {
  const out = $("chat-output");
  setState(out, "running", "");
  try {
    const response = await api("/v1/chat/completions", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ model: $("chat-model").value, stream: true,
                             max_tokens: Number($("chat-max-tokens").value) || undefined,
                             messages: [{ role: "user", content: $("chat-input").value }] }),
    });
    let chunks = 0;
    await readEvents(response, (event) => {
      if (event.error) throw new Error(event.error.message);
      const delta = event.choices && event.choices[0] && event.choices[0].delta;
      if (delta && delta.content) { out.textContent += delta.content; chunks += 1; out.dataset.chunks = chunks; }
    });
    setState(out, "done");
  } catch (e) {
    setState(out, "error", `error: ${e.message}`);
  }
}

// Speech: raw PCM (s16le mono) read as it arrives, each piece scheduled on a Web Audio clock right
// after the previous one, so playback starts with the first chunk.
async function speech() {
  const info = $("speech-info");
  setState(info, "running", "connecting...");
  try {
    const body = { model: $("speech-model").value, input: $("speech-input").value, response_format: "pcm" };
    if ($("speech-voice").value.trim()) body.voice = $("speech-voice").value.trim();
    if (Number($("speech-max-tokens").value)) body.max_tokens = Number($("speech-max-tokens").value);
    const response = await api("/v1/audio/speech", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
    const rate = Number(response.headers.get("x-audio-sample-rate")) || 24000;
    const context = new AudioContext({ sampleRate: rate });
    await context.resume();
    let next = context.currentTime + 0.05, samples = 0, chunks = 0, ended = 0, carry = null;
    const reader = response.body.getReader();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      let bytes = value;
      if (carry !== null) { bytes = new Uint8Array([carry, ...value]); carry = null; }
      if (bytes.length % 2) { carry = bytes[bytes.length - 1]; bytes = bytes.subarray(0, bytes.length - 1); }
      if (!bytes.length) continue;
      const pcm = new Int16Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length));
      const buffer = context.createBuffer(1, pcm.length, rate);
      const channel = buffer.getChannelData(0);
      for (let i = 0; i < pcm.length; i++) channel[i] = pcm[i] / 32768;
      const source = context.createBufferSource();
      source.buffer = buffer;
      source.connect(context.destination);
      source.onended = () => { ended += 1; info.dataset.ended = ended; };
      next = Math.max(next, context.currentTime);
      source.start(next);
      next += buffer.duration;
      samples += pcm.length; chunks += 1;
      if (chunks === 1) info.dataset.firstChunkAt = String(performance.now());
      info.dataset.samples = samples; info.dataset.chunks = chunks;
      info.textContent = `playing: ${chunks} chunks, ${(samples / rate).toFixed(2)} s of audio at ${rate} Hz`;
    }
    info.dataset.contextState = context.state;
    setState(info, "done", `${info.textContent} (stream ended)`);
  } catch (e) {
    setState(info, "error", `error: ${e.message}`);
  }
}

async function image() {
  const out = $("image-output");
  setState(out, "running", "working...");
  try {
    const model = $("image-model").value;
    const file = $("image-file").files[0];
    const steps = Number($("image-steps").value) || undefined;
    const size = $("image-size").value.trim() || "auto";
    let response;
    if (file || routes[model] === "image_edit") {
      if (!file) throw new Error("this model edits images: choose an image to edit");
      const form = new FormData();
      form.append("model", model);
      form.append("prompt", $("image-input").value);
      form.append("image", file);
      form.append("size", size);
      if (steps) form.append("num_inference_steps", String(steps));
      response = await api("/v1/images/edits", { method: "POST", body: form });
    } else {
      response = await api("/v1/images/generations", {
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ model, prompt: $("image-input").value, size, num_inference_steps: steps }),
      });
    }
    const result = await response.json();
    const format = result.output_format || "png";
    out.replaceChildren(...result.data.map((d) => {
      const img = new Image();
      img.src = `data:image/${format};base64,${d.b64_json}`;
      img.alt = $("image-input").value;
      return img;
    }));
    await Promise.all([...out.querySelectorAll("img")].map((img) => img.decode()));
    setState(out, "done");
  } catch (e) {
    setState(out, "error", `error: ${e.message}`);
  }
}

async function video() {
  const out = $("video-output"), bar = $("video-progress");
  setState(out, "running", "queued");
  bar.value = 0;
  try {
    const body = { model: $("video-model").value, prompt: $("video-input").value,
                   seconds: String($("video-seconds").value || "") || undefined };
    if ($("video-size").value.trim() && $("video-size").value.trim() !== "auto") body.size = $("video-size").value.trim();
    let job = await (await api("/v1/videos", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    })).json();
    while (job.status === "queued" || job.status === "in_progress") {
      bar.value = job.progress || 0;
      out.textContent = `${job.status} ${job.progress || 0}%`;
      await new Promise((resolve) => setTimeout(resolve, 500));
      job = await (await api(`/v1/videos/${job.id}`)).json();
    }
    if (job.status !== "completed") throw new Error((job.error && job.error.message) || job.status);
    bar.value = 100;
    const blob = await (await api(`/v1/videos/${job.id}/content`)).blob();
    const player = document.createElement("video");
    player.controls = true;
    player.src = URL.createObjectURL(blob);
    out.replaceChildren(player);
    setState(out, "done");
  } catch (e) {
    setState(out, "error", `error: ${e.message}`);
  }
}

$("api-key").value = localStorage.getItem("triton-omni-api-key") || "";
$("api-key").addEventListener("change", loadModels);
$("chat-send").addEventListener("click", chat);
$("speech-send").addEventListener("click", speech);
$("image-send").addEventListener("click", image);
$("video-send").addEventListener("click", video);
loadModels();
