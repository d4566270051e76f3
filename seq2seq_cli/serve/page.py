"""The web page `seq2seq serve` answers at `/`: plain HTML and JavaScript, nothing fetched from
elsewhere. The user picks the pair among those /languages lists (a source, or detect, and one of
its targets); the page sends the text to /v1/translate with `attention: true`, says which runs
(and pivot) translated it, and draws each sentence's cross-attention (source pieces across,
output pieces down) on a canvas (a pivot's: its last leg's)."""

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>seq2seq translate</title>
<style>
 body { font-family: sans-serif; max-width: 60em; margin: 2em auto; padding: 0 1em; }
 textarea { width: 100%; height: 7em; font-size: 1em; }
 #output { white-space: pre-wrap; border: 1px solid #ccc; padding: .5em; min-height: 2em; margin: 1em 0; }
 #error { color: #b00; }
 figure { margin: 1em 0; } figcaption { font-size: .9em; color: #444; }
 canvas { border: 1px solid #ddd; }
</style>
</head>
<body>
<h1>seq2seq</h1>
<p><label>From <select id="from"></select></label> <label>into <select id="into"></select></label>
 <span id="route"></span></p>
<p>One sentence per line.</p>
<textarea id="source" placeholder="Text to translate"></textarea>
<p><button id="translate">Translate</button>
 <label>API key <input id="key" size="20"></label>
 <span id="status"></span></p>
<div id="error"></div>
<div id="output"></div>
<div id="heatmaps"></div>
<script>
"use strict";
const $ = (id) => document.getElementById(id);

let languages = [];
function fillTargets() {
  const chosen = $("from").value;
  const found = languages.find((l) => l.code === chosen);
  const targets = chosen === "auto" ? [...new Set(languages.flatMap((l) => l.targets))] : (found ? found.targets : []);
  const keep = $("into").value;
  $("into").textContent = "";
  targets.forEach((code) => {
    const name = (languages.find((l) => l.code === code) || { name: code }).name;
    $("into").append(new Option(`${name} (${code})`, code, false, code === keep));
  });
}
fetch("languages").then((r) => r.json()).then((list) => {
  languages = list;
  list.filter((l) => l.targets.length).forEach((l) => $("from").append(new Option(`${l.name} (${l.code})`, l.code)));
  $("from").append(new Option("Detect", "auto"));
  fillTargets();
});
$("from").addEventListener("change", fillTargets);

function drawHeatmap(canvas, att) {
  const cell = 22, font = "12px sans-serif";
  const ctx = canvas.getContext("2d");
  ctx.font = font;
  const left = Math.max(...att.target.map((p) => ctx.measureText(p).width), 10) + 8;
  const top = Math.max(...att.source.map((p) => ctx.measureText(p).width), 10) + 8;
  canvas.width = left + cell * att.source.length + 2;
  canvas.height = top + cell * att.target.length + 2;
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  ctx.font = font;
  ctx.fillStyle = "#000";
  ctx.textBaseline = "middle";
  att.target.forEach((p, i) => { ctx.textAlign = "right"; ctx.fillText(p, left - 4, top + cell * i + cell / 2); });
  att.source.forEach((p, j) => {
    ctx.save();
    ctx.translate(left + cell * j + cell / 2, top - 4);
    ctx.rotate(-Math.PI / 2);
    ctx.textAlign = "left";
    ctx.fillText(p, 0, 0);
    ctx.restore();
  });
  att.weights.forEach((row, i) => row.forEach((w, j) => {
    const shade = Math.round(255 * (1 - Math.min(1, Math.max(0, w))));
    ctx.fillStyle = `rgb(${shade},${shade},255)`;
    ctx.fillRect(left + cell * j, top + cell * i, cell - 1, cell - 1);
  }));
}

async function translate() {
  $("error").textContent = "";
  $("status").textContent = "translating\\u2026";
  const body = { q: $("source").value, attention: true, source: $("from").value, target: $("into").value };
  if ($("key").value) body.api_key = $("key").value;
  try {
    const r = await fetch("v1/translate", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
    const data = await r.json();
    if (!r.ok) throw new Error(data.error || r.statusText);
    $("output").textContent = data.results.map((x) => x.translation).join("\\n");
    $("route").textContent = `${data.source} \\u2192 ${data.target}: ` + data.runs.join(", ")
      + (data.pivot ? ` (through ${data.pivot})` : "");
    const maps = $("heatmaps");
    maps.textContent = "";
    data.results.forEach((x, k) => {
      if (!x.attention || !x.attention.weights.length) return;
      const fig = document.createElement("figure");
      const cap = document.createElement("figcaption");
      cap.textContent = `sentence ${k + 1}: cross-attention (source across, output down)`;
      const canvas = document.createElement("canvas");
      canvas.className = "heatmap";
      fig.append(cap, canvas);
      maps.append(fig);
      drawHeatmap(canvas, x.attention);
    });
    $("status").textContent = "done";
  } catch (e) {
    $("error").textContent = String(e.message || e);
    $("status").textContent = "";
  }
}
$("translate").addEventListener("click", translate);
</script>
</body>
</html>
"""
