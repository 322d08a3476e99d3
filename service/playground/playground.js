// The playground: calls this server's API and draws the attention maps it returns.
// Plain browser JavaScript (no build step); the heat map is one canvas, one pixel block per weight.
"use strict";

const CELL = 18; // px per heat map cell (matches --cell in playground.css)

// --- API calls ---------------------------------------------------------------------------------

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = document.getElementById("api-key").value.trim();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

async function postJSON(path, body) {
  const response = await fetch(path, { method: "POST", headers: headers(), body: JSON.stringify(body) });
  const data = await response.json();
  if (!response.ok) throw new Error(data.error ? data.error.message : `HTTP ${response.status}`);
  return data;
}

// POST, then read Server-Sent Events as they arrive: onEvent(name, data) per event.
async function postSSE(path, body, onEvent) {
  const response = await fetch(path, { method: "POST", headers: headers(), body: JSON.stringify(body) });
  if (!response.ok) {
    const data = await response.json();
    throw new Error(data.error ? data.error.message : `HTTP ${response.status}`);
  }
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let name = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) name = line.slice(7);
        else if (line.startsWith("data: ")) data.push(line.slice(6));
        // lines starting with ":" are keep-alive comments
      }
      if (data.length) onEvent(name, JSON.parse(data.join("\n")));
    }
  }
}

// --- heat map ------------------------------------------------------------------------------------

// Perceptually ordered colours (viridis stops), interpolated.
const STOPS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
function colour(v) {
  const x = Math.min(1, Math.max(0, v)) * (STOPS.length - 1);
  const i = Math.min(STOPS.length - 2, Math.floor(x));
  const t = x - i;
  return STOPS[i].map((c, k) => Math.round(c + t * (STOPS[i + 1][k] - c)));
}

function tokenLabel(token) {
  return (token ?? "?").replace(/^Ġ/, "·").replace(/^▁/, "·").replace(/^##/, "");
}

// Brightness per cell in [0, 1]. Attention rows are softmaxes, and most rows put the bulk of their
// weight on the first token (an "attention sink"; in causal self-attention the first row is all on it):
// one scale for the whole map, set by those weights, left every other cell near black. So each row is
// scaled to its largest weight outside the first column, and the first column saturates; a row with
// nothing outside it (the first row of a causal map) is scaled to its own largest weight.
function cellShades(values) {
  return values.map((row) => {
    const rest = Math.max(0, ...row.slice(1));
    const scale = rest > 0 ? rest : Math.max(1e-9, ...row);
    return row.map((v) => Math.min(1, v / scale));
  });
}

// spec: {layers, heads, headChoices: [[value, label]], matrix(layer, head) -> {rows, cols, values}}
function drawHeatmap(container, spec) {
  container.replaceChildren(document.getElementById("heatmap-template").content.cloneNode(true));
  const layerSelect = container.querySelector('[data-role="layer"]');
  const headSelect = container.querySelector('[data-role="head"]');
  for (let l = 0; l < spec.layers; l++) layerSelect.add(new Option(`${l + 1} of ${spec.layers}`, String(l)));
  for (const [value, label] of spec.headChoices) headSelect.add(new Option(label, value));
  layerSelect.value = String(spec.layers - 1);

  const render = () => {
    const m = spec.matrix(Number(layerSelect.value), headSelect.value);
    const canvas = container.querySelector("canvas");
    canvas.width = m.cols.length * CELL;
    canvas.height = m.rows.length * CELL;
    canvas.dataset.rows = String(m.rows.length);
    canvas.dataset.cols = String(m.cols.length);
    const ctx = canvas.getContext("2d");
    cellShades(m.values).forEach((row, r) => row.forEach((v, c) => {
      const [red, green, blue] = colour(v);
      ctx.fillStyle = `rgb(${red},${green},${blue})`;
      ctx.fillRect(c * CELL, r * CELL, CELL, CELL);
    }));
    canvas.title = "brighter = more attention; each row is scaled to its largest weight after the first column";
    const label = (text) => Object.assign(document.createElement("span"), { textContent: tokenLabel(text), title: text });
    container.querySelector(".col-labels").replaceChildren(...m.cols.map(label));
    container.querySelector(".row-labels").replaceChildren(...m.rows.map(label));
  };
  layerSelect.addEventListener("change", render);
  headSelect.addEventListener("change", render);
  render();
}

const mean = (maps) => maps[0].map((row, r) => row.map((_, c) => maps.reduce((s, m) => s + m[r][c], 0) / maps.length));

// layers[L][H][rows][cols]: "mean" averages the heads.
function headMatrix(layers, layer, head) {
  return head === "mean" ? mean(layers[layer]) : layers[layer][Number(head)];
}

function headChoices(heads, first) {
  return [first, ...Array.from({ length: heads }, (_, h) => [String(h), `${h + 1} of ${heads}`])];
}

// maps[L][H][rows][cols], one matrix per head, the same token rows and columns in every one
// (translation's cross attention, generation's self attention): one head, or their mean.
function drawHeadMaps(heatmap, maps, rows, cols) {
  drawHeatmap(heatmap, {
    layers: maps.length,
    headChoices: headChoices(maps[0].length, ["mean", "mean of heads"]),
    matrix: (l, h) => ({ rows, cols, values: headMatrix(maps, l, h) }),
  });
}

// --- similarity matrix ---------------------------------------------------------------------------

function cosine(a, b) {
  let dot = 0, na = 0, nb = 0;
  for (let i = 0; i < a.length; i++) { dot += a[i] * b[i]; na += a[i] * a[i]; nb += b[i] * b[i]; }
  return dot / Math.max(Math.sqrt(na) * Math.sqrt(nb), 1e-12);
}

// A table of texts x texts, each cell its cosine (two decimals) on a colour from 0 (and below) to 1, the
// attention maps' viridis stops: sentence embeddings of unrelated texts sit near 0, paraphrases well above.
// Colours are set through the CSSOM: the page's Content-Security-Policy allows no inline style attributes.
function drawSimilarity(container, texts, vectors) {
  const table = Object.assign(document.createElement("table"), { className: "similarity" });
  const head = table.createTHead().insertRow();
  head.append(document.createElement("th"));
  const label = (text, i) => Object.assign(document.createElement("th"), { textContent: `${i + 1}. ${text}`, title: text });
  texts.forEach((text, i) => head.append(Object.assign(label(text, i), { textContent: String(i + 1) })));
  const body = table.createTBody();
  vectors.forEach((a, r) => {
    const row = body.insertRow();
    row.append(label(texts[r], r));
    vectors.forEach((b, c) => {
      const value = cosine(a, b);
      const cell = row.insertCell();
      cell.textContent = value.toFixed(2);
      cell.dataset.value = String(value);
      const [red, green, blue] = colour(value);
      cell.style.backgroundColor = `rgb(${red},${green},${blue})`;
      cell.style.color = value > 0.6 ? "#1d2433" : "#fff";
      cell.title = `${texts[r]}\n${texts[c]}\ncosine ${value.toFixed(4)}`;
    });
  });
  container.replaceChildren(table);
}

// --- the tasks -----------------------------------------------------------------------------------

const tasks = {
  async translate(form, output, heatmap) {
    const data = await postJSON("/v1/translate", {
      text: form.text.value, num_beams: Number(form.num_beams.value), return_attention: true,
    });
    const t = data.translations[0];
    output.textContent = t.text;
    drawHeadMaps(heatmap, t.attention.cross, t.attention.target_tokens, t.attention.source_tokens);
  },

  async generate(form, output, heatmap) {
    output.replaceChildren(Object.assign(document.createElement("span"), { className: "prompt", textContent: form.prompt.value }));
    const generated = document.createElement("span");
    generated.dataset.role = "generated";
    output.append(generated);
    const body = {
      prompt: form.prompt.value, max_new_tokens: Number(form.max_new_tokens.value),
      temperature: Number(form.temperature.value), stream: true, return_attention: true,
    };
    await postSSE("/v1/generate", body, (event, data) => {
      if (event === "token") {
        generated.append(Object.assign(document.createElement("span"), { className: "token", textContent: data.text }));
      } else if (event === "error") {
        throw new Error(data.error.message);
      } else if (event === "done" && data.attention) {
        drawHeadMaps(heatmap, data.attention.layers, data.attention.tokens, data.attention.tokens);
      }
    });
  },

  async classify(form, output, heatmap) {
    const data = await postJSON("/v1/classify", { text: form.text.value, return_attention: true });
    const r = data.results[0];
    output.textContent = `${r.label} (${(100 * r.score).toFixed(1)}%)`;
    const a = r.attention;
    const heads = a.layers[0].length;
    drawHeatmap(heatmap, {
      layers: a.layers.length,
      headChoices: headChoices(heads, ["all", "all heads"]),
      matrix: (l, h) => h === "all"
        ? { rows: a.layers[l].map((_, i) => `head ${i + 1}`), cols: a.tokens, values: a.layers[l].map((m) => m[0]) }
        : { rows: [`head ${Number(h) + 1}`], cols: a.tokens, values: [a.layers[l][Number(h)][0]] },
    });
  },

  async embed(form, output, heatmap) {
    const texts = form.texts.value.split("\n").map((t) => t.trim()).filter((t) => t);
    if (!texts.length) throw new Error("type one text per line");
    const data = await postJSON("/v1/embeddings", { input: texts });
    const vectors = data.data.sort((x, y) => x.index - y.index).map((d) => d.embedding);
    output.textContent = `${vectors.length} vectors of ${vectors[0].length} dimensions from ${data.model}, ` +
      `${data.usage.prompt_tokens} tokens`;
    drawSimilarity(heatmap, texts, vectors);
  },
};

for (const form of document.querySelectorAll("form[data-task]")) {
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const panel = form.closest(".panel");
    const output = panel.querySelector('[data-role="output"]');
    const heatmap = panel.querySelector('[data-role="heatmap"]');
    const button = form.querySelector('button[type="submit"]');
    button.disabled = true;
    heatmap.replaceChildren();
    output.textContent = "…";
    try {
      await tasks[form.dataset.task](form, output, heatmap);
    } catch (error) {
      output.replaceChildren(Object.assign(document.createElement("span"), { className: "error", textContent: error.message }));
    } finally {
      button.disabled = false;
    }
  });
}

for (const tab of document.querySelectorAll(".tab")) {
  tab.addEventListener("click", () => {
    for (const other of document.querySelectorAll(".tab")) other.setAttribute("aria-selected", String(other === tab));
    for (const panel of document.querySelectorAll(".panel")) panel.hidden = panel.id !== tab.dataset.tab;
  });
}
