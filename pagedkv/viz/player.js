// pagedkv's trace player: a recorded run (pagedkv/viz/trace.py's JSON) drawn step by step as block_map.py draws
// it (the same colours, stripes for shared blocks, free-queue numbers, hashes, group rows, the null block, hatched
// unnamed sliding blocks), with the step's text block map beside it, exactly as Python printed it. No framework, no network: one ES module.
//   - in a page: mountAll(document) plays every <div class="pkv-player" data-trace="ID"> whose trace is the JSON
//     in <script type="application/json" id="ID">, and wires every <input type="file" class="pkv-file">;
//   - in a notebook: the default export is an anywidget front end (pagedkv.viz.TracePlayer);
//   - anywhere: mount(element, traceObjectOrJSONText) returns {show(step), count, destroy()}.
// A trace that is empty or malformed is refused with a message in the page, never a blank page or an exception.

const FORMAT = "pagedkv-trace";
const VERSION = 1;
// block_map.py's colours: Okabe-Ito, then Paul Tol's muted and light schemes.
const PALETTE = ["#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#999933",
  "#882255", "#44AA99", "#332288", "#88CCEE", "#117733", "#DDCC77", "#CC6677", "#AA4499", "#77AADD", "#EE8866",
  "#BBCC33", "#FFAABB"];
const FREE = "#F4F4F4", CACHED = "#C9C9C9", EDGE = "#555555", HIGHLIGHT = "#CC0000", SOURCE = "#7B3294";
const NULL = "#3A3A3A", UNKNOWN = "#BBBBBB";
const CELL = 0.9; // a cell's side; the grid pitch is 1
const PX = 56; // pixels per grid unit
const PT = 1 / 39.6; // one typographic point in grid units (matplotlib: 0.55 inch per unit)
let hatchCount = 0; // each map's hatch pattern gets its own id

export class TraceError extends Error {}

function fail(message) {
  throw new TraceError(message);
}

const isInt = (x) => Number.isInteger(x);
const isIndex = (x, table) => isInt(x) && x >= 0 && x < table.length;

// ------------------------------------------------------------------------------------------- reading a trace
export function parseTrace(text) {
  if (typeof text !== "string") fail("the trace is not text.");
  if (!text.trim()) fail("the file is empty: it holds no trace.");
  try {
    return JSON.parse(text);
  } catch (error) {
    fail(`the file is not JSON (${error.message}).`);
  }
}

function decodeLines(before, items, where) {
  if (!Array.isArray(items)) fail(`${where}: its text is not a list of lines.`);
  const lines = [];
  for (const item of items) {
    if (typeof item === "string") lines.push(item);
    else if (isIndex(item, before)) lines.push(before[item]);
    else if (Array.isArray(item) && item.length === 2 && isIndex(item[0], before) && isInt(item[1]) && item[1] > 0
             && item[0] + item[1] <= before.length) lines.push(...before.slice(item[0], item[0] + item[1]));
    else if (Array.isArray(item) && item.length === 4 && isIndex(item[0], before) && typeof item[2] === "string"
             && isInt(item[1]) && isInt(item[3]) && item[1] >= 0 && item[3] >= 0
             && item[1] + item[3] <= before[item[0]].length) {
      const old = before[item[0]];
      lines.push(old.slice(0, item[1]) + item[2] + old.slice(old.length - item[3]));
    } else fail(`${where}: a text line ${JSON.stringify(item)}.`);
  }
  return lines;
}

function checkBlock(block, trace, where) {
  const ok = Array.isArray(block) && block.length === 4 && isInt(block[0]) && isInt(block[2])
    && Array.isArray(block[1]) && block[1].every((s) => isIndex(s, trace.ids))
    && (block[3] === -1 || isIndex(block[3], trace.hashes));
  if (!ok) fail(`${where}: a block entry ${JSON.stringify(block)}.`);
}

function checkBlockIds(list, count, where) {
  if (!Array.isArray(list) || !list.every((b) => isInt(b) && b >= 0 && b < count)) {
    fail(`${where}: a list of block ids that is not one (${JSON.stringify(list)}).`);
  }
}

// Every step's full frame, the deltas applied; the same checks as trace.py's decode().
export function decodeTrace(trace) {
  if (trace === null || typeof trace !== "object" || Array.isArray(trace) || trace.format !== FORMAT) {
    fail(`this is not a pagedkv trace: expected a JSON object with "format": "${FORMAT}".`);
  }
  if (trace.version !== VERSION) fail(`trace version ${JSON.stringify(trace.version)}; this player reads ${VERSION}.`);
  for (const key of ["block_size", "num_gpu_blocks", "num_cpu_blocks"]) {
    if (!isInt(trace[key]) || trace[key] < 0) fail(`"${key}" must be a whole number.`);
  }
  for (const key of ["ids", "hashes", "steps", "group_names"]) {
    if (!Array.isArray(trace[key])) fail(`"${key}" must be a list.`);
  }
  if (!trace.steps.length) fail("the trace has no steps.");
  const numGpu = trace.num_gpu_blocks, numBlocks = numGpu + trace.num_cpu_blocks;
  const frames = [];
  let frame = null;
  trace.steps.forEach((step, i) => {
    const where = `step ${i}`;
    if (step === null || typeof step !== "object" || Array.isArray(step)) fail(`${where} is not an object.`);
    if (i === 0) {
      const missing = ["blocks", "free", "free_cpu", "seqs", "prefix_stats", "text"].filter((k) => !(k in step));
      if (missing.length) fail(`step 0 must hold the whole state; it lacks ${missing.join(", ")}.`);
      if (typeof step.blocks !== "object" || Object.keys(step.blocks).length !== numBlocks) {
        fail(`step 0 must list all ${numBlocks} blocks.`);
      }
      frame = { blocks: new Array(numBlocks).fill(null), counters: {}, text: [], seqs: [] };
    }
    frame = { ...frame, blocks: frame.blocks.slice(), counters: { ...frame.counters },
      label: typeof step.label === "string" ? step.label : `step ${i}`,
      summary: typeof step.summary === "string" ? step.summary : "",
      event: step.event && typeof step.event === "object" ? step.event : {} };
    if ("blocks" in step) {
      if (!step.blocks || typeof step.blocks !== "object") fail(`${where}: "blocks" is not an object.`);
      for (const [key, block] of Object.entries(step.blocks)) {
        const index = Number(key);
        if (!/^\d+$/.test(key) || index >= numBlocks) fail(`${where}: no block ${key} in this pool.`);
        checkBlock(block, trace, where);
        frame.blocks[index] = block;
      }
    }
    if ("free" in step) { checkBlockIds(step.free, numGpu, where); frame.free = step.free; }
    if ("free_cpu" in step) { checkBlockIds(step.free_cpu, trace.num_cpu_blocks, where); frame.free_cpu = step.free_cpu; }
    if ("prefix_stats" in step) frame.prefix_stats = step.prefix_stats;
    if ("seqs" in step) {
      if (!Array.isArray(step.seqs)) fail(`${where}: "seqs" is not a list.`);
      const before = new Map(frame.seqs.map((s) => [s[0], s]));
      frame.seqs = step.seqs.map((s) => {
        const entry = Array.isArray(s) && s.length === 1 && i > 0 ? before.get(s[0]) : s;
        const ok = Array.isArray(entry) && entry.length === 4 && isIndex(entry[0], trace.ids)
          && (entry[1] === "gpu" || entry[1] === "cpu") && Array.isArray(entry[3]) && entry[3].length > 0
          && entry[3].every((t) => Array.isArray(t) && t.every(isInt));
        if (!ok) fail(`${where}: a sequence entry ${JSON.stringify(s)}.`);
        return entry;
      });
    }
    if (step.counters && typeof step.counters === "object") Object.assign(frame.counters, step.counters);
    frame.text = decodeLines(frame.text, "text" in step ? step.text : frame.text.map((_, k) => k), where);
    for (const key of ["highlight", "sources"]) {
      if (key in frame.event) checkBlockIds(frame.event[key], numBlocks, where);
    }
    if (frame.blocks.some((b) => b === null)) fail(`${where}: some blocks were never described.`);
    frames.push(frame);
  });
  return frames;
}

// ----------------------------------------------------------------------------------------------- drawing
function lighter(hex, amount = 0.6) {
  const [r, g, b] = [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16) / 255);
  const mix = (c) => Math.round((c + (1 - c) * amount) * 255);
  return `rgb(${mix(r)},${mix(g)},${mix(b)})`;
}

function gridColumns(numBlocks) {
  return Math.max(1, Math.min(numBlocks <= 128 ? 16 : 64, Math.ceil(Math.sqrt(numBlocks * 2))));
}

// block_map.seq_colors: the sequences still alive keep their colours; new ones take unused ones, in order.
function seqColors(frame, keep) {
  const colors = new Map();
  for (const s of frame.seqs) if (keep.has(s[0])) colors.set(s[0], keep.get(s[0]));
  const taken = new Set(colors.values());
  let unused = PALETTE.filter((c) => !taken.has(c));
  if (!unused.length) unused = PALETTE;
  let i = 0;
  for (const s of frame.seqs) if (!colors.has(s[0])) colors.set(s[0], unused[i++ % unused.length]);
  return colors;
}

const esc = (text) => String(text).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
  .replace(/"/g, "&quot;");

function text(x, y, content, { size = 8, anchor = "start", base = "auto", color = "#000", bold = false } = {}) {
  return `<text x="${x.toFixed(3)}" y="${y.toFixed(3)}" font-size="${(size * PT).toFixed(4)}" text-anchor="${anchor}"`
    + ` dominant-baseline="${base}" fill="${color}"${bold ? ' font-weight="bold"' : ""}>${esc(content)}</text>`;
}

function rect(x, y, w, h, fill, extra = "") {
  return `<rect x="${x.toFixed(3)}" y="${y.toFixed(3)}" width="${w.toFixed(3)}" height="${h.toFixed(3)}" fill="${fill}"${extra}/>`;
}

function outline(x, y, color, width, extra = "") {
  return `<rect x="${x}" y="${y}" width="${CELL}" height="${CELL}" fill="none" stroke="${color}"`
    + ` stroke-width="${(width * PT).toFixed(4)}"${extra}/>`;
}

// ManagerState.sliding_blocks(named=False): with prefix caching, the real blocks of sliding-window tables that hold
// no hash (nobody can hit them; freed to the head of the free queue). block_map.py hatches them.
function unnamedSliding(trace, frame) {
  const unnamed = new Set();
  if (!trace.prefix_caching) return unnamed;
  for (const s of frame.seqs) {
    trace.group_names.forEach((g, k) => {
      if (!String(g).startsWith("sliding")) return;
      for (const b of s[3][k] || []) {
        if (b !== trace.null_block && frame.blocks[b] && frame.blocks[b][3] === -1) unnamed.add(b);
      }
    });
  }
  return unnamed;
}

// One step's block map as SVG: the pools as grids of cells, then each sequence's block table(s).
function drawMap(trace, frame, colors) {
  const numGpu = trace.num_gpu_blocks, numCpu = trace.num_cpu_blocks, blockSize = trace.block_size;
  const nullBlock = trace.null_block ?? null;
  const pools = [["gpu", numGpu, 0], ["cpu", numCpu, numGpu]].filter((p) => p[1] > 0);
  const labels = numGpu + numCpu <= 128;
  const freePos = { gpu: new Map((frame.free || []).map((b, i) => [b, i])),
    cpu: new Map((frame.free_cpu || []).map((b, i) => [b, i])) };
  const cols = {}, rows = {};
  for (const [device, n] of pools) { cols[device] = gridColumns(n); rows[device] = Math.ceil(n / cols[device]); }
  const names = trace.group_names;
  const tableRows = [];
  for (const s of frame.seqs) {
    const name = trace.ids[s[0]];
    if (names.length) names.forEach((g, k) => tableRows.push([s, `seq ${name} · ${g}`, s[3][k] || [], String(g)]));
    else tableRows.push([s, `seq ${name}`, s[3][0], ""]);
  }
  const longest = Math.max(0, ...tableRows.map((r) => r[2].length));
  const width = Math.max(pools.reduce((a, p) => a + cols[p[0]], 0) + pools.length - 1,
    tableRows.length ? (labels ? longest : longest / 2 + 2) : 0, 4);
  const pitch = labels ? 1 : Math.max(1, Math.round(width / 32));
  const poolRows = Math.max(1, ...pools.map((p) => rows[p[0]]));
  const height = poolRows + (tableRows.length ? tableRows.length * pitch + 1.5 : 0);
  const labelWidth = tableRows.length ? Math.max(2.2, ...tableRows.map((r) => 0.1 + 0.13 * (r[1].length + 5))) : 0.5;
  const event = frame.event || {};
  const marked = new Set(event.highlight || []), copied = new Set(event.sources || []);
  const out = [], edges = [];
  // A large map (no labels) gathers its rectangles into one path per colour, as block_map.py gathers them into
  // one PolyCollection: a few elements instead of thousands, so a 512-block step still draws quickly.
  const batch = !labels, paths = new Map();
  const fillRect = (x, y, w, h, color, extra = "") => {
    if (!batch) { out.push(rect(x, y, w, h, color, extra)); return; }
    const d = `M${x.toFixed(3)} ${y.toFixed(3)}h${w.toFixed(3)}v${h.toFixed(3)}h${(-w).toFixed(3)}z`;
    paths.set(color, (paths.get(color) || "") + d);
  };
  const unnamed = unnamedSliding(trace, frame), hatchId = `pkv-hatch-${++hatchCount}`;
  const hatch = (x, y, w, h, attrs = "") => {
    if (batch) paths.set("hatch", (paths.get("hatch") || "") + `M${x.toFixed(3)} ${y.toFixed(3)}h${w}v${h}h${-w}z`);
    else out.push(`<rect x="${x}" y="${y}" width="${w}" height="${h}" fill="url(#${hatchId})" class="pkv-unnamed"${attrs}/>`);
  };
  let x0 = 0;
  for (const [device, n, offset] of pools) {
    out.push(text(x0, -0.35, `${device.toUpperCase()} pool (${n} blocks)`, { size: 9, bold: true }));
    for (let id = 0; id < n; id++) {
      const [ref, owners, numTokens, hash] = frame.blocks[offset + id];
      const x = x0 + (id % cols[device]), y = Math.floor(id / cols[device]);
      const free = freePos[device].get(id);
      const attrs = ` data-device="${device}" data-block="${id}"`;
      if (device === "gpu" && id === nullBlock) {
        fillRect(x, y, CELL, CELL, NULL, `${attrs} class="pkv-null"`);
        if (labels) {
          out.push(text(x + 0.04, y + 0.04, id, { base: "hanging", color: "white" }));
          out.push(text(x + 0.45, y + 0.55, "null", { anchor: "middle", base: "central", color: "white" }));
        }
      } else if (free !== undefined) {
        fillRect(x, y, CELL, CELL, hash >= 0 ? CACHED : FREE, `${attrs} data-free="${free}"`);
      } else {
        const known = owners.filter((s) => colors.has(s));
        const stripes = known.length ? known : [null];
        const stripe = CELL / stripes.length, filled = CELL * numTokens / blockSize;
        if (!batch) out.push(`<g${attrs} data-ref="${ref}" data-seqs="${esc(owners.map((s) => trace.ids[s]).join(","))}">`);
        stripes.forEach((s, k) => {
          const color = s === null ? UNKNOWN : colors.get(s);
          fillRect(x + k * stripe, y, stripe, CELL, lighter(color));
          fillRect(x + k * stripe, y + CELL - filled, stripe, filled, color);
        });
        if (!batch) out.push("</g>");
        if (device === "gpu" && unnamed.has(id)) hatch(x, y, CELL, CELL, ` data-block="${id}"`);
      }
      if (labels && !(device === "gpu" && id === nullBlock)) {
        out.push(text(x + 0.04, y + 0.04, id, { base: "hanging" }));
        if (free !== undefined) {
          out.push(text(x + 0.5, y + 0.5, `#${free}`, { anchor: "middle", base: "central", color: "#555555" }));
        } else if (ref > 1) {
          out.push(text(x + 0.5, y + 0.5, `x${ref}`, { size: 9, anchor: "middle", base: "central", bold: true }));
        }
        if (hash >= 0) out.push(text(x + 0.45, y + 0.86, trace.hashes[hash].slice(0, 4), { anchor: "middle", color: "#333333" }));
      }
      const index = offset + id;
      const color = marked.has(index) ? HIGHLIGHT : copied.has(index) ? SOURCE : EDGE;
      if (batch && color === EDGE) paths.set("edge", (paths.get("edge") || "") + `M${x} ${y}h${CELL}v${CELL}h${-CELL}z`);
      else edges.push(outline(x, y, color, color === EDGE ? 0.6 : 2.2, color === EDGE ? "" : ` class="pkv-${color === HIGHLIGHT ? "highlight" : "source"}"`));
    }
    x0 += cols[device] + 1;
  }
  if (tableRows.length) {
    const top = poolRows + 1;
    out.push(text(0, top - 0.35, "block tables", { size: 9, bold: true }));
    tableRows.forEach(([s, label, table, group], r) => {
      const y = top + r * pitch, onCpu = s[1] === "cpu";
      const count = labels ? "" : ` (${table.length})`;
      out.push(`<g class="pkv-table" data-seq="${esc(trace.ids[s[0]])}" data-entries="${table.join(",")}">`);
      out.push(text(-0.1, y + 0.5 * pitch, label + count, { size: 9, anchor: "end", base: "central" }));
      const base = colors.get(s[0]) || UNKNOWN;
      const color = onCpu ? lighter(base, 0.5) : base;
      table.forEach((blockId, i) => {
        const isNull = blockId === nullBlock;
        if (!labels) {
          fillRect(i * 0.5, y + 0.3 * pitch, 0.45, 0.4 * pitch, isNull ? NULL : color);
          if (unnamed.has(blockId) && group.startsWith("sliding")) hatch(i * 0.5, y + 0.3 * pitch, 0.45, 0.4 * pitch);
          return;
        }
        out.push(rect(i, y + 0.1, CELL, 0.8, isNull ? NULL : color, ` stroke="${EDGE}" stroke-width="${(0.6 * PT).toFixed(4)}"`));
        if (unnamed.has(blockId) && group.startsWith("sliding")) hatch(i, y + 0.1, CELL, 0.8);
        out.push(text(i + 0.45, y + 0.5, isNull ? "null" : `${blockId}${onCpu ? "c" : ""}`,
          { size: isNull ? 7 : 8, anchor: "middle", base: "central", color: isNull ? "white" : "black" }));
      });
      out.push("</g>");
    });
  }
  const used = frame.blocks.slice(0, numGpu).filter((b, id) => !freePos.gpu.has(id) && id !== nullBlock).length;
  const title = `block_size ${blockSize}: ${used}/${numGpu} GPU blocks used`;
  const left = -labelWidth, right = width + 0.2, topY = -1.3, bottom = height + 0.2;
  const viewW = right - left, viewH = bottom - topY;
  return `<svg class="pkv-map" xmlns="http://www.w3.org/2000/svg" viewBox="${left.toFixed(2)} ${topY} ${viewW.toFixed(2)} ${viewH.toFixed(2)}"`
    + ` width="${Math.round(viewW * PX)}" height="${Math.round(viewH * PX)}" font-family="DejaVu Sans, Verdana, sans-serif"`
    + ` role="img" aria-label="${esc(title)}">`
    + text((left + right) / 2, -0.95, title, { size: 10, anchor: "middle" })
    + `<defs><pattern id="${hatchId}" patternUnits="userSpaceOnUse" width="0.18" height="0.18" patternTransform="rotate(45)">`
    + `<line x1="0" y1="0" x2="0" y2="0.18" stroke="${EDGE}" stroke-width="0.03"/></pattern></defs>`
    + [...paths].filter(([c]) => c !== "edge" && c !== "hatch").map(([c, d]) => `<path d="${d}" fill="${c}"/>`).join("")
    + (paths.has("hatch") ? `<path d="${paths.get("hatch")}" fill="url(#${hatchId})"/>` : "")
    + out.join("")
    + (paths.has("edge") ? `<path d="${paths.get("edge")}" fill="none" stroke="${EDGE}" stroke-width="${(0.6 * PT).toFixed(4)}"/>` : "")
    + edges.join("") + "</svg>";
}

function keyHtml(trace, frame) {
  const swatch = (color, words, border = EDGE) => `<span class="pkv-key-item"><span class="pkv-swatch" style="background:${color};border-color:${border}"></span>${esc(words)}</span>`;
  const plain = (words) => `<span class="pkv-key-item">${esc(words)}</span>`;
  const items = [swatch(PALETTE[0], "a sequence's block: dark = slots with tokens"),
    swatch(lighter(PALETTE[0]), "pale = empty slots"), swatch(FREE, "free block"),
    plain("stripes, xN: shared by N sequences (ref count)"), plain("#n: place in the free queue (#0 goes next)"),
    plain("top-left number: physical block id"), plain("block table entry i: the physical block of logical block i")];
  if (trace.prefix_caching) items.push(swatch(CACHED, "free but cached: keeps its hash (bottom)"));
  if (trace.null_block !== null && trace.null_block !== undefined) {
    items.push(swatch(NULL, "null block: stands for a block that left the window"));
  }
  const event = frame.event || {};
  if (unnamedSliding(trace, frame).size) {
    items.push(`<span class="pkv-key-item"><span class="pkv-swatch" style="background:repeating-linear-gradient(-45deg,${EDGE} 0 1px,#fff 1px 4px);border-color:${EDGE}"></span>${esc("hatched: a sliding block with no hash (nobody can hit it; freed to the queue's head)")}</span>`,
      plain("sliding block not hatched: named (hashed), a later request can resume from it"));
  }
  if ((event.highlight || []).length) items.push(swatch("transparent", "red outline: the blocks this step touched", HIGHLIGHT));
  if ((event.sources || []).length) items.push(swatch("transparent", "purple outline: a copy's source", SOURCE));
  return items.join("");
}

function eventHtml(trace, frame) {
  const e = frame.event || {}, name = (i) => esc(trace.ids[i] ?? `?${i}`);
  const parts = [];
  const ids = (key) => (Array.isArray(e[key]) ? e[key] : []).map(name).join(", ");
  if (Array.isArray(e.scheduled) && e.scheduled.length) {
    parts.push(`scheduled: ${e.scheduled.map(([r, n]) => `${name(r)} (${n})`).join(", ")}`);
  }
  for (const [key, words] of [["admitted", "admitted"], ["preempted", "preempted"], ["finished", "finished"]]) {
    if (ids(key)) parts.push(`${words}: ${ids(key)}`);
  }
  const pairs = (key, arrow, suffix) => (Array.isArray(e[key]) ? e[key] : []).map(([a, b]) => `${a}${arrow}${b}${suffix}`).join(", ");
  if (Array.isArray(e.freed) && e.freed.length) parts.push(`freed blocks: ${e.freed.join(", ")}`);
  if (pairs("copied", "→", "")) parts.push(`copied: ${pairs("copied", "→", "")}`);
  if (pairs("swapped_out", "→c", "")) parts.push(`swapped out: ${pairs("swapped_out", "→c", "")}`);
  if (Array.isArray(e.swapped_in) && e.swapped_in.length) parts.push(`swapped in: ${e.swapped_in.map(([c, g]) => `c${c}→${g}`).join(", ")}`);
  const queues = ["running", "waiting", "swapped"].filter((q) => ids(q)).map((q) => `${q} [${ids(q)}]`);
  const counters = Object.entries(frame.counters || {}).map(([k, v]) => `${esc(k)} ${esc(v)}`).join(" · ");
  return (parts.length ? `<div class="pkv-what">${parts.join("; ")}</div>` : "")
    + (queues.length ? `<div class="pkv-queues">${queues.join("  ")}</div>` : "")
    + (counters ? `<div class="pkv-counters">${counters}</div>` : "");
}

const STYLE = `
.pkv-root { font-family: system-ui, sans-serif; font-size: 14px; color: #222; border: 1px solid #ddd;
  border-radius: 6px; padding: 10px; margin: 1em 0; background: #fff; }
.pkv-root .pkv-title { font-weight: bold; margin-bottom: 4px; }
.pkv-root .pkv-controls { display: flex; gap: 6px; align-items: center; flex-wrap: wrap; margin: 6px 0; }
.pkv-root .pkv-controls button { font-size: 14px; padding: 2px 10px; cursor: pointer; }
.pkv-root .pkv-slider { flex: 1; min-width: 120px; }
.pkv-root .pkv-body { display: flex; gap: 16px; align-items: flex-start; flex-wrap: wrap; }
.pkv-root .pkv-figure { flex: 1 1 420px; min-width: 300px; overflow-x: auto; }
.pkv-root .pkv-map { max-width: 100%; height: auto; display: block; }
.pkv-root .pkv-text { flex: 1 1 360px; margin: 0; padding: 6px; background: #f7f7f7; border: 1px solid #e2e2e2;
  font-size: 12px; line-height: 1.3; overflow: auto; max-height: 85vh; white-space: pre; }
.pkv-root .pkv-summary { font-family: ui-monospace, monospace; font-size: 13px; margin: 4px 0; }
.pkv-root .pkv-what, .pkv-root .pkv-queues, .pkv-root .pkv-counters { font-size: 12px; color: #444; margin: 2px 0; }
.pkv-root .pkv-key { display: flex; flex-wrap: wrap; gap: 4px 14px; font-size: 12px; margin: 6px 0; }
.pkv-root .pkv-swatch { display: inline-block; width: 12px; height: 12px; border: 1.5px solid; margin-right: 4px;
  vertical-align: -2px; }
.pkv-error { border: 2px solid #CC0000; background: #fff3f3; color: #600; padding: 10px; border-radius: 6px;
  font-family: system-ui, sans-serif; margin: 1em 0; }
`;

function message(el, words) {
  el.innerHTML = `<style>${STYLE}</style><div class="pkv-error" role="alert"></div>`;
  el.querySelector(".pkv-error").textContent = `This trace cannot be played: ${words}`;
}

// Play `source` (a trace object, or its JSON text) in `el` from step `start`; {show(i), count, current(), destroy()}.
// `onStep(i)` hears of each step the reader moves to (buttons, slider, arrow keys), not of show(i) calls.
export function mount(el, source, { onStep = null, start = 0 } = {}) {
  let trace, frames;
  try {
    trace = typeof source === "string" ? parseTrace(source) : source;
    if (trace === null || trace === undefined || (typeof trace === "object" && !Array.isArray(trace) && !Object.keys(trace).length)) {
      fail("there is no trace here (an empty object): record one with python -m pagedkv trace <run>.");
    }
    frames = decodeTrace(trace);
  } catch (error) {
    message(el, error instanceof TraceError ? error.message : `it could not be read (${error}).`);
    return { show() {}, count: 0, current: () => 0, destroy() { el.innerHTML = ""; }, error: true };
  }
  const colors = [];
  frames.forEach((f, i) => colors.push(seqColors(f, i ? colors[i - 1] : new Map())));
  el.innerHTML = `<style>${STYLE}</style><div class="pkv-root" tabindex="0">
    <div class="pkv-title"></div>
    <div class="pkv-controls">
      <button class="pkv-first" title="first step">|◀</button><button class="pkv-back" title="step back (←)">◀ back</button>
      <button class="pkv-forward" title="step forward (→)">forward ▶</button><button class="pkv-last" title="last step">▶|</button>
      <input class="pkv-slider" type="range" min="0" max="${frames.length - 1}" value="0" aria-label="step">
      <span class="pkv-position"></span>
    </div>
    <div class="pkv-summary"></div>
    <div class="pkv-body"><div class="pkv-figure"><div class="pkv-svg"></div><div class="pkv-key"></div>
      <div class="pkv-event"></div></div><pre class="pkv-text"></pre></div></div>`;
  const $ = (selector) => el.querySelector(selector);
  $(".pkv-title").textContent = trace.title || "pagedkv trace";
  let current = 0;
  function show(i, notify = true) {  // notify: a step the reader chose, which onStep hears of
    const step = Math.max(0, Math.min(frames.length - 1, Number.isInteger(i) ? i : 0));
    const frame = frames[step];
    let svg, key, what;
    try {
      [svg, key, what] = [drawMap(trace, frame, colors[step]), keyHtml(trace, frame), eventHtml(trace, frame)];
    } catch (error) {
      message(el, `step ${step} cannot be drawn (${error.message}).`);
      return;
    }
    current = step;
    $(".pkv-svg").innerHTML = svg;
    $(".pkv-key").innerHTML = key;
    $(".pkv-event").innerHTML = what;
    $(".pkv-text").textContent = frame.text.join("\n");
    $(".pkv-summary").textContent = frame.summary || frame.label;
    $(".pkv-position").textContent = `step ${step} / ${frames.length - 1}: ${frame.label}`;
    $(".pkv-slider").value = String(step);
    $(".pkv-back").disabled = step === 0;
    $(".pkv-first").disabled = step === 0;
    $(".pkv-forward").disabled = step === frames.length - 1;
    $(".pkv-last").disabled = step === frames.length - 1;
    el.dataset.step = String(step);
    if (onStep && notify) onStep(step);
  }
  $(".pkv-first").addEventListener("click", () => show(0));
  $(".pkv-back").addEventListener("click", () => show(current - 1));
  $(".pkv-forward").addEventListener("click", () => show(current + 1));
  $(".pkv-last").addEventListener("click", () => show(frames.length - 1));
  $(".pkv-slider").addEventListener("input", (e) => show(Number(e.target.value)));
  $(".pkv-root").addEventListener("keydown", (e) => {
    if (e.key === "ArrowRight") { show(current + 1); e.preventDefault(); }
    if (e.key === "ArrowLeft") { show(current - 1); e.preventDefault(); }
  });
  show(start, false);
  return { show: (i) => show(i, false), count: frames.length, current: () => current, destroy() { el.innerHTML = ""; }, error: false };
}

// Every player of a page (its trace in the <script type="application/json"> its data-trace names), and every
// file input that opens a trace from disk into the page's first player.
export function mountAll(root) {
  const players = [...root.querySelectorAll(".pkv-player")].map((el) => {
    const holder = el.dataset.trace ? (root.getElementById ? root : document).getElementById(el.dataset.trace) : null;
    el.pkv = mount(el, holder ? holder.textContent : "");
    return el;
  });
  for (const input of root.querySelectorAll("input.pkv-file")) {
    input.addEventListener("change", () => {
      const file = input.files && input.files[0];
      const target = players[0];
      if (!file || !target) return;
      file.text().then((content) => { target.pkv = mount(target, content); },
        (error) => message(target, `the file could not be read (${error}).`));
    });
  }
  return players;
}

// anywidget front end (pagedkv.viz.TracePlayer): traits `trace` (the JSON object) and `step`.
function render({ model, el }) {
  const onStep = (i) => {
    if (model.get("step") !== i) { model.set("step", i); model.save_changes(); }
  };
  let player = mount(el, model.get("trace"), { onStep, start: model.get("step") || 0 });
  const retrace = () => { player = mount(el, model.get("trace"), { onStep, start: model.get("step") || 0 }); };
  const restep = () => player.show(model.get("step"));
  model.on("change:trace", retrace);
  model.on("change:step", restep);
  return () => { model.off("change:trace", retrace); model.off("change:step", restep); };
}

export default { render };
