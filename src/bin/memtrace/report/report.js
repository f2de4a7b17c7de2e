// memtrace report page. Vanilla JS, no libraries: every view is computed from the embedded
// blocks with the filter model of filter.rs (same clauses, same half-open ranges).
'use strict';
(async function () {
const $ = (id) => document.getElementById(id);
const SVGNS = 'http://www.w3.org/2000/svg';
const T0 = performance.now();
const D = JSON.parse($('report-data').textContent);
const FR = D.frames, STR = FR.strings;
const nFrames = FR.fn.length;
const fnOf = (f) => STR[FR.fn[f]];
// Labels come from the CLI (analysis::Frame::label); flame colours are worked out once per frame.
const frameLabel = (f) => STR[FR.label[f]];
// The site of allocations with no frame to show (no backtrace, or every frame hidden): a
// frame id past the last, as `hotspots` names it.
const NO_SITE = nFrames, siteLabel = (f) => (f === NO_SITE ? '(no backtrace)' : frameLabel(f));
const COLORS = Array.from({ length: nFrames }, (_, f) => {
  const h = [...fnOf(f)].reduce((x, ch) => (x * 31 + ch.charCodeAt(0)) >>> 0, 7);
  return FR.alloc[f] ? '#c9ced6' : `hsl(${15 + (h % 40)},${70 + (h % 20)}%,${58 + (h % 12)}%)`;
});

// ------------------------------------------------------------------ decoding
async function gunzip(b64) {
  const bin = atob(b64); const u8 = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) u8[i] = bin.charCodeAt(i);
  const ds = new Blob([u8]).stream().pipeThrough(new DecompressionStream('gzip'));
  return new Response(ds).arrayBuffer();
}
async function decode(T) {
  const buf = await gunzip(T.cols); const n = T.nblocks;
  const col = (k) => new Uint32Array(buf, 4 * n * k, n);
  const dt = col(0), life = col(1), tick = T.tick_us;
  const a = new Float64Array(n), f = new Float64Array(n);
  let t = 0;
  for (let i = 0; i < n; i++) { t += dt[i]; a[i] = t * tick; f[i] = life[i] === 0 ? -1 : (t + life[i] - 1) * tick; }
  const ns = col(2), w = col(3), s = col(4);
  const bps = (T.info.word_size / 8) / T.info.rate; // bytes per sample
  // Objects an allocation stands for: analysis::estimated_objects.
  const obj = new Float32Array(n); for (let i = 0; i < n; i++) obj[i] = ns[i] / (Math.max(w[i], 1) * T.info.rate);
  const parent = Int32Array.from(T.nodes.parent), frame = Int32Array.from(T.nodes.frame);
  return { T, n, a, f, ns, w, s, obj, bps, parent, frame, nNodes: parent.length, dur: T.duration_us, peakT: T.peak.t, wordBytes: T.info.word_size / 8 };
}
const traces = await Promise.all(D.traces.map(decode));
const DIFF = traces.length === 2;
const A = traces[0], B = traces[traces.length - 1];
const DUR = Math.max(...traces.map((t) => t.dur), 1);

// ------------------------------------------------------------------ formatting
function fmtBytes(x) {
  const s = x < 0 ? '−' : ''; x = Math.abs(x);
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB']; let i = 0;
  while (x >= 1024 && i < u.length - 1) { x /= 1024; i++; }
  const d = i === 0 ? 0 : x < 10 ? 2 : x < 100 ? 1 : 0;
  return `${s}${x.toFixed(d)} ${u[i]}`;
}
function fmtCount(x) { const s = x < 0 ? '−' : ''; x = Math.abs(x); return s + (x >= 1e6 ? (x / 1e6).toFixed(2) + 'M' : x >= 1e4 ? (x / 1e3).toFixed(1) + 'k' : x.toFixed(x < 10 ? 1 : 0)); }
function fmtTime(us) {
  if (us < 1000) return `${+us.toFixed(0)}µs`;
  if (us < 1e6) return `${+(us / 1e3).toPrecision(4)}ms`;
  if (us < 6e7) return `${+(us / 1e6).toPrecision(4)}s`;
  return `${+(us / 6e7).toPrecision(4)}min`;
}
// The parsers of filter.rs: a plain time is seconds, a plain size bytes; undefined when
// the text is neither, null when it is empty.
function parseTime(s) {
  s = s.trim(); if (!s) return null;
  const m = /^([0-9]*\.?[0-9]+(?:e[-+]?\d+)?)\s*(us|µs|ms|s|min)?$/.exec(s); if (!m) return undefined;
  const k = { us: 1, 'µs': 1, ms: 1e3, s: 1e6, min: 6e7 }[m[2] || 's'];
  return Math.round(parseFloat(m[1]) * k);
}
function parseSize(s) {
  s = s.trim(); if (!s) return null;
  const m = /^([0-9]*\.?[0-9]+(?:e[-+]?\d+)?)\s*(B|KiB|MiB|GiB|K|M|G)?$/.exec(s); if (!m) return undefined;
  const k = { B: 1, KiB: 1024, K: 1024, MiB: 1 << 20, M: 1 << 20, GiB: 1 << 30, G: 1 << 30 }[m[2] || 'B'];
  return Math.round(parseFloat(m[1]) * k);
}
// A time as filter.rs prints it: the largest unit that keeps it whole.
function cliTime(us) { return us && us % 1e6 === 0 ? `${us / 1e6}s` : us && us % 1e3 === 0 ? `${us / 1e3}ms` : `${us}us`; }
const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' }[c]));
// The 95% interval of the mean of a Poisson count n: analysis::estimate's rule, line for
// line (solved for from the distribution function below EXACT_BELOW samples, Byar's
// approximation above), so that the page and the command line print the same bounds.
const Z = 1.959963984540054, EXACT_BELOW = 100;
function poissonCdf(k, mean) { let term = Math.exp(-mean), sum = term; for (let i = 1; i <= k; i++) { term *= mean / i; sum += term; } return Math.min(sum, 1); }
function solve(f, target, max) { let lo = 0, hi = max; for (let i = 0; i < 100; i++) { const mid = (lo + hi) / 2; if (f(mid) < target) lo = mid; else hi = mid; } return (lo + hi) / 2; }
const exact95 = []; // by count: solving costs some 20 000 steps, and sites share counts
function poisson95(n) {
  if (n < EXACT_BELOW) {
    return (exact95[n] ||= [n === 0 ? 0 : solve((m) => 1 - poissonCdf(n - 1, m), 0.025, n), solve((m) => 1 - poissonCdf(n, m), 0.975, 2 * n + 8)]);
  }
  const byar = (k, sign) => k * Math.pow(1 - 1 / (9 * k) + (sign * Z) / (3 * Math.sqrt(k)), 3);
  return [byar(n, -1), byar(n + 1, 1)];
}
const LOW = 10; // figures from fewer samples are marked
// A step between time ticks of at least `raw` µs: 1, 2 or 5 × 10ⁿ below a second, then whole
// seconds, minutes and hours that a clock divides into (never 100 s).
function timeStep(raw) {
  if (raw <= 5e5) return niceStep(raw);
  const steps = [1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 600, 900, 1200, 1800, 3600, 7200, 10800, 21600, 43200, 86400];
  const s = steps.find((s) => raw <= s * 1e6);
  return s ? s * 1e6 : Math.ceil(raw / 864e8) * 864e8;
}
// A tick's time, `step` µs after the one before: below a minute in one unit for the whole
// axis, chosen for the trace's length (`0 s`, `0.5 s`, `1 s`; `0 ms`, `20 ms`), with the
// decimals of the step; then in minutes and seconds (`1min 30s`), never a fraction of a minute.
function fmtTick(us, step) {
  if (us < 6e7) {
    const [k, unit] = DUR >= 1e6 ? [1e6, 's'] : DUR >= 1e3 ? [1e3, 'ms'] : [1, 'µs'];
    const decimals = Math.max(0, -Math.floor(Math.log10(step / k) + 1e-9));
    return `${+(us / k).toFixed(decimals)} ${unit}`;
  }
  const s = Math.round(us / 1e6), h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
  return [h ? `${h}h` : '', m ? `${m}min` : '', sec ? `${sec}s` : ''].filter(Boolean).join(' ') || '0s';
}
function niceStep(raw) { const p = Math.pow(10, Math.floor(Math.log10(raw))); const r = raw / p; return (r <= 1 ? 1 : r <= 2 ? 2 : r <= 5 ? 5 : 10) * p; }
function el(tag, attrs, parent) { const e = document.createElementNS(SVGNS, tag); for (const k in attrs) e.setAttribute(k, attrs[k]); if (parent) parent.appendChild(e); return e; }

// ------------------------------------------------------------------ summary
{
  const dl = $('summary'); const add = (k, v) => { dl.insertAdjacentHTML('beforeend', `<dt>${esc(k)}</dt><dd>${esc(v)}</dd>`); };
  for (const [i, t] of traces.entries()) {
    const p = DIFF ? (i ? 'B (new) ' : 'A (base) ') : '';
    add(p + 'trace', `${t.T.name} — ${t.T.info.executable} on ${t.T.info.host}, pid ${t.T.info.pid}`);
    add(p + 'started', new Date(t.T.info.start_us / 1000).toISOString().replace('T', ' ').replace('Z', ' UTC'));
    const th = t.T.thinned;
    add(p + 'duration', `${fmtTime(t.dur)}; ${t.T.events} events; ${th ? th.blocks : t.n} sampled blocks; rate ${th ? `${(t.T.info.rate / th.keep).toPrecision(3)}, thinned to ${t.T.info.rate.toPrecision(3)}` : t.T.info.rate.toPrecision(3)} (one sample ≈ ${fmtBytes(t.bps)})`);
    add(p + 'peak', `${fmtBytes(t.T.peak.bytes)} at ${fmtTime(t.peakT)}`);
    if (t.T.truncated) add(p + 'note', 'the trace is truncated; read up to the cut');
    for (const w of t.T.warnings) add(p + 'warning', w);
  }
  const thin = traces.filter((t) => t.T.thinned);
  if (thin.length) {
    $('thinned').hidden = false;
    $('thinned').textContent = thin.map((t) => { const th = t.T.thinned; return `${t.T.name}: its ${th.blocks.toLocaleString('en')} sampled blocks exceed the limit of ${D.limit.toLocaleString('en')} (memtrace report --limit), so each of their ${th.samples.toLocaleString('en')} samples was kept with probability ${th.keep.toPrecision(3)}, as if the trace had been sampled at that fraction of its rate: ${t.n.toLocaleString('en')} blocks remain. Every filter clause is exact for them; the figures are estimates whose 95% intervals include the thinning, and the command line's figures (from every sample) should fall within them. The peak is that of every sample.`; }).join(' ');
  }
}

// ------------------------------------------------------------------ filter (filter.rs)
const F = { allocLo: null, allocHi: null, live: '', liveAt: null, collected: '', collLo: null, collHi: null,
  sizeMin: null, sizeMax: null, lifeMin: null, lifeMax: null, inside: [], notInside: [], hide: [], measure: 'bytes', trim: true, trimRoot: true };
// Per frame: whether the `hide` clause leaves it out of the stacks.
function hiddenFrames() { const h = new Uint8Array(nFrames); for (let fr = 0; fr < nFrames; fr++) h[fr] = F.hide.some((x) => fnOf(fr).includes(x)) ? 1 : 0; return h; }
// Per stack node: whether the path to it passes the function clauses, null if there are
// none (filter.rs, Filter::passing_stacks: every `inside` substring and no `not inside` one;
// hidden frames count here, as they do for restrict, which runs before Filter::hide_frames).
function stackMask(t) {
  if (!F.inside.length && !F.notInside.length) return null;
  const m = new Uint8Array(t.nNodes).fill(1);
  for (const [subs, want] of [[F.inside, 1], [F.notInside, 0]]) for (const sub of subs) {
    const hit = new Uint8Array(nFrames); for (let f = 0; f < nFrames; f++) hit[f] = fnOf(f).includes(sub) ? 1 : 0;
    const on = new Uint8Array(t.nNodes); // some frame on the path contains sub
    for (let i = 1; i < t.nNodes; i++) { on[i] = on[t.parent[i]] | hit[t.frame[i]]; if (on[i] !== want) m[i] = 0; }
    if (on[0] !== want) m[0] = 0;
  }
  return m;
}
// Returns the matching block indices of trace t, in a buffer of the trace's that the next
// call reuses (a new array per change would only feed the garbage collector).
function applyFilter(t) {
  const { n, a, f, w } = t; const out = (t.matched ||= new Uint32Array(n)); let k = 0;
  const aLo = F.allocLo ?? -Infinity, aHi = F.allocHi ?? Infinity;
  let liveT = null, liveEnd = false;
  if (F.live === 'time' && F.liveAt != null) liveT = F.liveAt; else if (F.live === 'peak') liveT = t.peakT; else if (F.live === 'end') liveEnd = true;
  const coll = F.collected; const cLo = F.collLo ?? -Infinity, cHi = F.collHi ?? Infinity;
  const sMin = F.sizeMin ?? -Infinity, sMax = F.sizeMax ?? Infinity, wb = t.wordBytes;
  const lMin = F.lifeMin, lMax = F.lifeMax;
  const stackOk = stackMask(t);
  const s = t.s;
  for (let i = 0; i < n; i++) {
    const ai = a[i], fi = f[i];
    if (ai < aLo || ai >= aHi) continue;
    if (liveT !== null && !(ai <= liveT && (fi < 0 || fi > liveT))) continue;
    if (liveEnd && fi >= 0) continue;
    if (coll === 'never' && fi >= 0) continue;
    if (coll === 'between' && (fi < 0 || fi < cLo || fi >= cHi)) continue;
    const bytes = w[i] * wb; if (bytes < sMin || bytes >= sMax) continue;
    if (lMin != null && fi >= 0 && fi - ai < lMin) continue;
    if (lMax != null && (fi < 0 || fi - ai >= lMax)) continue;
    if (stackOk && !stackOk[s[i]]) continue;
    out[k++] = i;
  }
  return out.subarray(0, k);
}
// `s` as one word of a shell: filter.rs's `quoted`.
const quoted = (s) => `'${s.replace(/'/g, "'\\''")}'`;
// The same filter as `memtrace hotspots` flags, printed as filter.rs's Display does, after
// the command of the page's own settings (`--span`, `--full-names`) and the trimming.
function cliEquivalent() {
  const p = [D.cli];
  if (!F.trim) p.push('--keep-allocator-frames'); if (!F.trimRoot) p.push('--keep-root-frames');
  const range = (lo, hi) => `${cliTime(lo ?? 0)}:${cliTime(hi ?? Math.ceil(DUR) + 1)}`;
  if (F.allocLo != null || F.allocHi != null) p.push(`--allocated-between ${range(F.allocLo, F.allocHi)}`);
  if (F.live === 'time' && F.liveAt != null) p.push(`--live-at ${cliTime(F.liveAt)}`); else if (F.live === 'peak' || F.live === 'end') p.push(`--live-at ${F.live}`);
  if (F.collected === 'never') p.push('--never-collected'); else if (F.collected === 'between') p.push(`--collected-between ${range(F.collLo, F.collHi)}`);
  if (F.sizeMin != null) p.push(`--size-at-least ${F.sizeMin}B`); if (F.sizeMax != null) p.push(`--size-under ${F.sizeMax}B`);
  if (F.lifeMin != null) p.push(`--lifetime-at-least ${cliTime(F.lifeMin)}`); if (F.lifeMax != null) p.push(`--lifetime-under ${cliTime(F.lifeMax)}`);
  for (const x of F.inside) p.push(`--inside ${quoted(x)}`); for (const x of F.notInside) p.push(`--not-inside ${quoted(x)}`);
  for (const x of F.hide) p.push(`--hide ${quoted(x)}`);
  return p.join(' ');
}

// ------------------------------------------------------------------ reading the form
const inputs = { 'f-alloc-lo': ['allocLo', parseTime], 'f-alloc-hi': ['allocHi', parseTime], 'f-live-at': ['liveAt', parseTime],
  'f-coll-lo': ['collLo', parseTime], 'f-coll-hi': ['collHi', parseTime], 'f-size-min': ['sizeMin', parseSize], 'f-size-max': ['sizeMax', parseSize],
  'f-life-min': ['lifeMin', parseTime], 'f-life-max': ['lifeMax', parseTime] };
function readForm() {
  let ok = true;
  for (const id in inputs) {
    const [k, parse] = inputs[id]; const v = parse($(id).value);
    const bad = v === undefined; $(id).classList.toggle('bad', bad); $(id).setAttribute('aria-invalid', bad);
    if (bad) ok = false; else F[k] = v;
  }
  F.live = $('f-live').value; F.collected = $('f-collected').value;
  const list = (id) => $(id).value.split(';').map((x) => x.trim()).filter(Boolean);
  F.inside = list('f-inside'); F.notInside = list('f-not-inside'); F.hide = list('f-hide');
  F.measure = $('f-measure').value; F.trim = $('f-trim').checked; F.trimRoot = $('f-trim-root').checked;
  return ok;
}
function setField(id, v) { $(id).value = v; }
let timer = 0, applied = '';
// Re-render only when the filter really changed: a 'change' event fired by the blur of a
// field already applied must not rebuild the tables under a pending click.
function applyForm() { if (!readForm()) return; const k = JSON.stringify(F); if (k !== applied) update(); }
function schedule() { clearTimeout(timer); timer = setTimeout(applyForm, 120); }
$('filters').addEventListener('input', schedule);
$('filters').addEventListener('change', () => { clearTimeout(timer); applyForm(); });
// The trimming `memtrace report --keep-allocator-frames / --keep-root-frames` asked for.
const trimDefaults = () => { $('f-trim').checked = !D.keep.allocator; $('f-trim-root').checked = !D.keep.root; };
trimDefaults();
$('f-reset').addEventListener('click', () => { $('filters').reset(); trimDefaults(); readForm(); flame.zoom = -1; flame.focus = -1; update(); });

// Two questions a click apart: what is live at the peak (the page opens on it), and what was
// allocated at all.
$('q-peak').addEventListener('click', () => { setField('f-live', 'peak'); applyForm(); });
$('q-allocated').addEventListener('click', () => { setField('f-live', ''); applyForm(); });
function showQuestion() {
  for (const [id, on] of [['q-peak', F.live === 'peak'], ['q-allocated', F.live === '']]) { $(id).classList.toggle('on', on); $(id).setAttribute('aria-pressed', on); }
}

// ------------------------------------------------------------------ the view in the URL
// Every control of the view (the filter bar, the flame graph's mode and roots) whose value is
// not the page's default, as `#key=value&…` in the URL's fragment (the page is a file: the
// fragment is what a link to it can carry), kept up to date as the view changes; a URL with a
// view in it opens that view.
const VIEW_IDS = [...document.querySelectorAll('#filters input, #filters select')].map((e) => e.id).concat(['fg-mode', 'fg-root']);
const viewKey = (id) => id.replace(/^f-/, '');
const controlValue = (e) => (e.type === 'checkbox' ? (e.checked ? '1' : '0') : e.value);
let viewDefaults = null; // by id, taken before the URL's view is applied
function viewFragment() {
  const q = new URLSearchParams();
  for (const id of VIEW_IDS) { const v = controlValue($(id)); if (v !== viewDefaults[id]) q.set(viewKey(id), v); }
  const s = q.toString(); return s ? '#' + s : '';
}
function saveView() { const h = viewFragment(); if (h !== location.hash) history.replaceState(null, '', h || location.pathname + location.search); }
function loadView() {
  const q = new URLSearchParams(location.hash.slice(1));
  for (const id of VIEW_IDS) {
    const e = $(id), v = q.get(viewKey(id)) ?? viewDefaults[id];
    if (e.type === 'checkbox') e.checked = v === '1';
    else { e.value = v; if (e.value !== v) e.value = viewDefaults[id]; } // a select keeps a known option
  }
  flame.mode = $('fg-mode').value; flame.root = $('fg-root').value;
}

// ------------------------------------------------------------------ per-filter computation
const NB = 600; // timeline samples
// The live bytes of the blocks `idx` (ascending: in allocation order) over the trace: at each
// of the NB + 1 points k·dt, the most live in the bucket ((k−1)·dt, k·dt] (at 0, at time 0),
// so that the curve reaches every peak between two points, the labelled one included; then,
// as point NB + 1, what is live once the trace has ended.
// Events at one time count together, as for the command line's peak (blocks::PeakFinder).
function liveSeries(t, idx) {
  const dt = DUR / NB, { a, f, ns, bps } = t, out = new Float64Array(NB + 2);
  const chosen = (t.chosen ||= new Uint8Array(t.n)); chosen.fill(0);
  for (let j = 0; j < idx.length; j++) chosen[idx[j]] = 1;
  // Freed blocks by free time, sorted once per trace.
  const byFree = (t.byFree ||= Int32Array.from(Array.from({ length: t.n }, (_, i) => i).filter((i) => f[i] >= 0).sort((x, y) => f[x] - f[y])));
  let live = 0, ja = 0, jf = 0, cur = 0;
  for (;;) {
    while (jf < byFree.length && !chosen[byFree[jf]]) jf++;
    const time = Math.min(ja < idx.length ? a[idx[ja]] : Infinity, jf < byFree.length ? f[byFree[jf]] : Infinity);
    if (time === Infinity) break;
    const b = Math.min(NB, Math.ceil(time / dt));
    while (cur < b) out[++cur] = live; // what is live as the bucket starts
    for (; ja < idx.length && a[idx[ja]] === time; ja++) live += ns[idx[ja]] * bps;
    for (; jf < byFree.length && (!chosen[byFree[jf]] || f[byFree[jf]] === time); jf++) if (chosen[byFree[jf]]) live -= ns[byFree[jf]] * bps;
    out[b] = Math.max(out[b], live);
  }
  while (cur < NB) out[++cur] = live;
  out[NB + 1] = live; // at the end, after its last events: the heap's fall at exit
  for (let k = 0; k <= NB + 1; k++) if (out[k] < 1e-6) out[k] = 0;
  return out;
}
const allIdx = traces.map((t) => { const u = new Uint32Array(t.n); for (let i = 0; i < t.n; i++) u[i] = i; return u; });
const totalSeries = traces.map((t, i) => liveSeries(t, allIdx[i]));

// The display tree: stacks with hidden frames left out, allocator frames trimmed from the
// inner end, optionally re-rooted at a focused frame. Shared by both traces in diff mode.
function buildTree(results) {
  const hideFrame = hiddenFrames();
  const tree = { parent: [-1], frame: [-1], depth: [0], kids: [new Map()], w: [new Float64Array(0), new Float64Array(0)] };
  const selfW = [[0], [0]], selfN = [[0], [0]], selfB = [[0], [0]];
  function child(p, fr) {
    let c = tree.kids[p].get(fr);
    if (c === undefined) { c = tree.parent.length; tree.parent.push(p); tree.frame.push(fr); tree.depth.push(tree.depth[p] + 1); tree.kids.push(new Map()); tree.kids[p].set(fr, c);
      for (const a of [selfW, selfN, selfB]) { a[0].push(0); a[1].push(0); } }
    return c;
  }
  // The flame graph's roots (`memtrace flamegraph --root`): thread frames are drawn only split
  // by thread, span frames unless merged too; a frame not drawn counts for its callee.
  const undrawn = Uint8Array.from({ length: nFrames }, (_, fr) => FR.pseudo[fr] && (flame.root === 'code' || (flame.root === 'span' && FR.thread[fr])));
  results.forEach((r, ti) => {
    const t = traces[ti]; if (!r) return;
    // Trimming and hiding as the command line does (Filter::hide_frames, then
    // analysis::Trim::kept): hidden frames are left out first; then allocator machinery is
    // trimmed from the inner end (trimTo: the nearest ancestor-or-self that is neither),
    // and start-up frames (analysis::is_root_frame) from the outer end: a node whose path
    // from the outermost frame is all start-up (or hidden) frames, below the thread and span
    // frames that stay outermost, is left out. A stack made only of allocator frames keeps
    // them, and one made only of start-up frames too.
    const trimTo = new Int32Array(t.nNodes);
    for (let i = 1; i < t.nNodes; i++) trimTo[i] = FR.alloc[t.frame[i]] || hideFrame[t.frame[i]] ? trimTo[t.parent[i]] : i;
    // A hand-off to a runtime just inside them is trimmed too (frames::hands_off_to_runtime):
    // the outermost kept frame, root frames, then that frame's own closure or async body, whose
    // node is then drawn under what is outside the outermost kept frame (`anchor`).
    const outerPseudo = new Uint8Array(t.nNodes), startup = new Uint8Array(t.nNodes);
    const handOff = new Int32Array(t.nNodes).fill(-1), between = new Int32Array(t.nNodes), anchor = new Int32Array(t.nNodes).fill(-1);
    for (let i = 1; i < t.nNodes; i++) {
      const p = t.parent[i], fr = t.frame[i], outer = p === 0 || outerPseudo[p];
      outerPseudo[i] = FR.pseudo[fr] && outer ? 1 : 0;
      if (!F.trimRoot) continue;
      startup[i] = (FR.root[fr] || hideFrame[fr]) && (outer || startup[p]) ? 1 : 0;
      if (startup[i] || outerPseudo[i]) continue;
      const h = handOff[p];
      if (outer || startup[p]) { handOff[i] = i; between[i] = 0; } // the outermost kept frame
      else if (h >= 0 && (hideFrame[fr] || FR.root[fr])) { handOff[i] = h; between[i] = between[p] + (hideFrame[fr] ? 0 : 1); }
      else if (h >= 0 && between[p] > 0 && FR.body_of[fr] === FR.fn[t.frame[h]]) anchor[i] = t.parent[h];
    }
    // Display nodes, memoised per node, and whether the path passes through the focused
    // frame: [0] with start-up frames trimmed, [1] kept.
    const focus = flame.focus;
    const disps = [0, 1].map(() => { const d = new Int32Array(t.nNodes).fill(-2); d[0] = 0; return d; });
    const inFocuses = [0, 1].map(() => new Uint8Array(t.nNodes).fill(focus < 0 ? 1 : 0));
    const dispOf = (node, keepStartup) => {
      const disp = disps[keepStartup], inFocus = inFocuses[keepStartup];
      if (disp[node] !== -2) return disp[node];
      const stack = []; let x = node; while (disp[x] === -2) { stack.push(x); x = t.parent[x]; }
      for (let k = stack.length - 1; k >= 0; k--) {
        // A hand-off's body hangs from its anchor, an ancestor, so already placed.
        const y = stack[k], fr = t.frame[y], p = anchor[y] >= 0 ? anchor[y] : t.parent[y];
        if (hideFrame[fr] || undrawn[fr] || (startup[y] && !keepStartup)) { disp[y] = disp[p]; inFocus[y] = inFocus[p]; continue; }
        if (!inFocus[p]) { if (fr === focus) { disp[y] = child(0, fr); inFocus[y] = 1; } else disp[y] = 0; continue; }
        disp[y] = child(disp[p], fr); inFocus[y] = 1;
      }
      return disp[node];
    };
    const nodeW = new Float64Array(t.nNodes), nodeN = new Float64Array(t.nNodes), nodeB = new Float64Array(t.nNodes);
    const count = F.measure === 'count';
    for (let j = 0; j < r.length; j++) { const i = r[j], s = t.s[i]; nodeW[s] += count ? t.obj[i] : t.ns[i] * t.bps; nodeN[s] += t.ns[i]; nodeB[s] += 1; }
    for (let i = 0; i < t.nNodes; i++) {
      if (!nodeB[i]) continue;
      let leaf = F.trim ? trimTo[i] : i; if (leaf === 0) leaf = i;
      const keep = startup[leaf], d = dispOf(leaf, keep);
      if (!inFocuses[keep][leaf]) continue; // the stack does not pass through the focused frame
      selfW[ti][d] += nodeW[i]; selfN[ti][d] += nodeN[i]; selfB[ti][d] += nodeB[i];
    }
  });
  const m = tree.parent.length;
  const tot = [new Float64Array(m), new Float64Array(m)], totN = [new Float64Array(m), new Float64Array(m)];
  for (let ti = 0; ti < 2; ti++) for (let i = m - 1; i >= 0; i--) { tot[ti][i] += selfW[ti][i]; totN[ti][i] += selfN[ti][i]; if (i) { tot[ti][tree.parent[i]] += tot[ti][i]; totN[ti][tree.parent[i]] += totN[ti][i]; } }
  Object.assign(tree, { m, selfW, selfN, selfB, tot, totN });
  return tree;
}

// ------------------------------------------------------------------ state and update
let R = null, TREE = null; // filter results, display tree
const view = { site: -1 }; // selected site (frame id) for the site timeline
const widths = {};
function measure() { for (const id of ['timeline', 'site-timeline', 'flamegraph', 'lifetimes']) widths[id] = $(id).clientWidth; }
function update() {
  const t0 = performance.now(); applied = JSON.stringify(F); measure();
  R = traces.map(applyFilter);
  TREE = buildTree(DIFF ? R : [R[0], null]);
  const t1 = performance.now();
  $('cli-equivalent').textContent = cliEquivalent();
  const tot = R.map((r, ti) => { const t = traces[ti]; let n = 0; for (let j = 0; j < r.length; j++) n += t.ns[r[j]]; return n; });
  $('filter-totals').textContent = traces.map((t, ti) => `${DIFF ? (ti ? 'B: ' : 'A: ') : ''}${R[ti].length.toLocaleString('en')} of ${t.n.toLocaleString('en')} blocks, ${fmtBytes(tot[ti] * t.bps)} (${tot[ti]} samples)`).join('; ');
  const views = {};
  for (const [k, fn] of [['timeline', drawTimeline], ['site_timeline', drawSiteTimeline], ['flame', drawFlame], ['sites', drawSites], ['functions', drawFunctions], ['lifetimes', drawLifetimes], ['poi', drawPoi]]) { const s = performance.now(); fn(); views[k] = Math.round(performance.now() - s); }
  const t2 = performance.now();
  const timing = (window.__memtraceTiming = { filter_ms: t1 - t0, render_ms: t2 - t1, total_ms: t2 - t0, views });
  requestAnimationFrame(() => setTimeout(() => { timing.painted_ms = performance.now() - t0; }, 0));
  showQuestion(); saveView();
  document.body.dataset.updates = String((+document.body.dataset.updates || 0) + 1);
}
const val = (tree, i) => (DIFF ? tree.tot[1][i] - tree.tot[0][i] : tree.tot[0][i]);
const fmtM = (x) => (F.measure === 'count' ? fmtCount(x) : fmtBytes(x));

// ------------------------------------------------------------------ timeline
const TAIL = 14;
function chartFrame(container, height, drawAxes) {
  const width = Math.max(300, widths[container.id] || 700);
  const m = { l: 62, r: 12, t: 24, b: 30 };
  container.textContent = '';
  const svg = el('svg', { viewBox: `0 0 ${width} ${height}`, height, role: 'img' }, container);
  // The trace's time spans the plot but its last TAIL px, where the live curve shows what is
  // left once the trace ends: the fall at exit is then a drop the eye sees, not the last pixel.
  const pw = width - m.l - m.r, ph = height - m.t - m.b, tw = pw - TAIL;
  return { svg, width, height, m, pw, ph, x: (t) => m.l + (t / DUR) * tw, tOf: (px) => Math.min(DUR, Math.max(0, ((px - m.l) / tw) * DUR)) };
}
function yAxis(c, max, fmt) {
  const step = niceStep(Math.max(max, 1) / 4), unit = max >= 1 << 30 ? 1 << 30 : max >= 1 << 20 ? 1 << 20 : max >= 1024 ? 1024 : 1;
  // round ticks in the display unit
  const s = unit > 1 ? niceStep(Math.max(max, 1) / unit / 4) * unit : step;
  const top = Math.max(s, Math.ceil(max / s) * s);
  const y = (v) => c.m.t + c.ph - (v / top) * c.ph;
  const g = el('g', { class: 'axis' }, c.svg);
  for (let v = 0; v <= top + s / 2; v += s) {
    el('line', { x1: c.m.l, x2: c.m.l + c.pw, y1: y(v), y2: y(v), stroke: '#eee' }, g);
    el('text', { x: c.m.l - 4, y: y(v) + 4, 'text-anchor': 'end' }, g).textContent = fmt(v);
  }
  return y;
}
function xAxes(c, wall) {
  const g = el('g', { class: 'axis' }, c.svg);
  // A wall-clock label is about 80 px wide: keep its ticks far enough apart.
  const step = timeStep(DUR / Math.max(2, Math.floor(c.pw / (wall ? 150 : 110))));
  el('line', { x1: c.m.l, x2: c.m.l + c.pw, y1: c.m.t + c.ph, y2: c.m.t + c.ph }, g);
  for (let t = 0; t <= DUR + 1e-9; t += step) {
    const x = c.x(t);
    el('line', { x1: x, x2: x, y1: c.m.t + c.ph, y2: c.m.t + c.ph + 4 }, g);
    const anchor = x < c.m.l + 30 ? 'start' : x > c.m.l + c.pw - 40 ? 'end' : 'middle';
    el('text', { x, y: c.m.t + c.ph + 16, 'text-anchor': anchor }, g).textContent = fmtTick(t, step);
    if (wall) {
      const d = new Date((traces[0].T.info.start_us + t) / 1000);
      const s = d.toISOString().slice(11, step < 1e6 ? 23 : 19);
      el('text', { x, y: c.m.t - 8, 'text-anchor': anchor, fill: '#5b5b66' }, g).textContent = s;
    }
  }
  el('text', { x: c.m.l + c.pw, y: c.height - 2, 'text-anchor': 'end', fill: '#5b5b66' }, g).textContent = 'elapsed';
  if (wall) el('text', { x: c.m.l - 6, y: c.m.t - 8, 'text-anchor': 'end', fill: '#5b5b66' }, g).textContent = 'UTC';
}
// The curve of the series ys (NB + 1 values over the trace), and the area under it.
function linePath(c, ys, y) {
  let d = '';
  for (let k = 0; k <= NB; k++) d += `${k ? 'L' : 'M'}${c.x((k * DUR) / NB).toFixed(1)},${y(ys[k]).toFixed(1)}`;
  return d;
}
// The area under a live series, its end (point NB + 1) drawn in the plot's tail.
const pathOf = (c, ys, y) => {
  const end = `L${c.x(DUR).toFixed(1)},${y(ys[NB + 1]).toFixed(1)}L${c.m.l + c.pw},${y(ys[NB + 1]).toFixed(1)}L${c.m.l + c.pw},${y(0)}`;
  return `M${c.x(0)},${y(0)}${linePath(c, ys, y).replace(/^M/, 'L')}${end}Z`;
};
function drawTimeline() {
  const box = $('timeline'); const c = chartFrame(box, 240);
  const filt = R.map((r, ti) => liveSeries(traces[ti], r));
  const peaks = traces.map((t) => t.T.peak.bytes);
  const max = Math.max(...peaks, ...totalSeries.map((s) => Math.max(...s)));
  const y = yAxis(c, max, fmtBytes); xAxes(c, true);
  const colors = DIFF ? ['#8a8a8a', '#1f5fbf'] : ['#1f5fbf'];
  for (let ti = traces.length - 1; ti >= 0; ti--)
    el('path', { d: pathOf(c, totalSeries[ti], y), fill: ti === traces.length - 1 ? '#dfe3ea' : 'none', stroke: DIFF && !ti ? '#555' : '#9aa3b5', 'stroke-dasharray': DIFF && !ti ? '4 3' : '', class: 'total' }, c.svg);
  traces.forEach((t, ti) => el('path', { d: pathOf(c, filt[ti], y), fill: colors[ti], 'fill-opacity': DIFF ? 0.25 : 0.45, stroke: colors[ti], 'stroke-width': 1.5, 'stroke-dasharray': DIFF && !ti ? '4 3' : '', class: 'filtered' }, c.svg));
  traces.forEach((t, ti) => {
    const px = c.x(t.peakT), py = y(peaks[ti]) + (DIFF && !ti ? 14 : 0);
    el('circle', { cx: px, cy: y(peaks[ti]), r: 4, fill: '#d9480f', class: 'peak' }, c.svg);
    const lab = el('text', { x: px + (px > c.width - 200 ? -6 : 6), y: Math.max(c.m.t + 10, py - 6), 'text-anchor': px > c.width - 200 ? 'end' : 'start', fill: '#d9480f', id: ti ? 'peak-label-b' : 'peak-label' }, c.svg);
    lab.textContent = `${DIFF ? (ti ? 'B ' : 'A ') : ''}peak ${fmtBytes(peaks[ti])} at ${fmtTime(t.peakT)}`;
  });
  // selection shading
  if (F.allocLo != null || F.allocHi != null) {
    const x0 = c.x(F.allocLo ?? 0), x1 = c.x(Math.min(F.allocHi ?? DUR, DUR));
    el('rect', { x: x0, y: c.m.t, width: Math.max(1, x1 - x0), height: c.ph, fill: '#1f5fbf', 'fill-opacity': 0.08, stroke: '#1f5fbf', 'stroke-dasharray': '3 2', class: 'selection' }, c.svg);
  }
  const lt = F.live === 'time' ? F.liveAt : F.live === 'peak' ? B.peakT : F.live === 'end' ? DUR : null;
  if (lt != null) el('line', { x1: c.x(lt), x2: c.x(lt), y1: c.m.t, y2: c.m.t + c.ph, stroke: '#d9480f', 'stroke-width': 1.5, class: 'live-at' }, c.svg);
  const fmax = Math.max(...filt.map((s) => Math.max(...s)));
  const leg = el('text', { x: c.m.l + 6, y: c.m.t + 12, id: 'timeline-legend' }, c.svg);
  const filtered = R.some((r, ti) => r.length < traces[ti].n);
  leg.textContent = `${filtered ? 'filtered' : 'live'}: max ${fmtBytes(fmax)}${DIFF ? ' (A dashed, B solid)' : ''}`;
  const liveMax = Math.max(...totalSeries[totalSeries.length - 1]);
  Object.assign(c.svg.dataset, { x0: c.m.l, x1: c.x(DUR), t0: 0, t1: DUR, endLive: totalSeries[totalSeries.length - 1][NB + 1], filteredMax: fmax, liveMax, peakBytes: peaks[peaks.length - 1] });
  c.svg.id = 'timeline-svg';
  // drag to select
  const sel = el('rect', { y: c.m.t, height: c.ph, fill: '#1f5fbf', 'fill-opacity': 0.15, visibility: 'hidden' }, c.svg);
  const pt = (e) => { const r = c.svg.getBoundingClientRect(); return ((e.clientX - r.left) / r.width) * c.width; };
  let start = null;
  c.svg.onpointerdown = (e) => { if (e.button) return; start = pt(e); c.svg.setPointerCapture(e.pointerId); sel.setAttribute('x', start); sel.setAttribute('width', 0); sel.setAttribute('visibility', 'visible'); };
  c.svg.onpointermove = (e) => { if (start === null) { hoverTimeline(e, c, pt(e), filt); return; } const x = pt(e); sel.setAttribute('x', Math.min(x, start)); sel.setAttribute('width', Math.abs(x - start)); };
  c.svg.onpointerleave = () => { $('tooltip').hidden = true; };
  c.svg.onpointerup = (e) => {
    if (start === null) return; const x = pt(e); const s0 = start; start = null;
    if (Math.abs(x - s0) < 3) { setField('f-live', 'time'); setField('f-live-at', fmtTime(Math.round(c.tOf(x)))); }
    else { const lo = Math.round(c.tOf(Math.min(x, s0))), hi = Math.round(c.tOf(Math.max(x, s0))); setField('f-alloc-lo', fmtTime(lo)); setField('f-alloc-hi', fmtTime(hi)); }
    applyForm();
  };
}
function hoverTimeline(e, c, px, filt) {
  const t = c.tOf(px), k = Math.round((t / DUR) * NB), tip = $('tooltip');
  if (px < c.m.l || px > c.m.l + c.pw) { tip.hidden = true; return; }
  tip.hidden = false; tip.style.left = e.clientX + 12 + 'px'; tip.style.top = e.clientY + 12 + 'px';
  tip.textContent = `${fmtTime(t)}: live ${traces.map((_, ti) => fmtBytes(totalSeries[ti][k])).join(' / ')}, filtered ${filt.map((s) => fmtBytes(s[k])).join(' / ')}`;
}
$('timeline').addEventListener('keydown', (e) => {
  if (!['ArrowLeft', 'ArrowRight', 'Home', 'End'].includes(e.key)) return;
  e.preventDefault(); const step = DUR / 100; let t = F.live === 'time' && F.liveAt != null ? F.liveAt : B.peakT;
  t = e.key === 'Home' ? 0 : e.key === 'End' ? DUR : t + (e.key === 'ArrowLeft' ? -step : step);
  setField('f-live', 'time'); setField('f-live-at', fmtTime(Math.round(Math.min(DUR, Math.max(0, t))))); applyForm();
});

// ------------------------------------------------------------------ per-site live heap
// Ten colours that no two of look alike (Tableau 10).
const PALETTE = ['#4e79a7', '#f28e2b', '#e15759', '#76b7b2', '#59a14f', '#edc948', '#b07aa1', '#ff9da7', '#9c755f', '#79706e'];
function siteOfStack(t) { // per stack node: display site frame (innermost visible non-allocator frame), NO_SITE none
  const hideFrame = hiddenFrames();
  const vis = new Int32Array(t.nNodes).fill(NO_SITE), nonAlloc = new Int32Array(t.nNodes).fill(NO_SITE);
  for (let i = 1; i < t.nNodes; i++) {
    const fr = t.frame[i], p = t.parent[i];
    vis[i] = hideFrame[fr] ? vis[p] : fr;
    nonAlloc[i] = hideFrame[fr] || (F.trim && FR.alloc[fr]) ? nonAlloc[p] : fr;
  }
  for (let i = 1; i < t.nNodes; i++) if (nonAlloc[i] === NO_SITE) nonAlloc[i] = vis[i];
  return nonAlloc;
}
// The top sites' live heap over time. One trace: the 8 largest sites of the filtered
// allocations, stacked. A diff: the 8 sites whose bytes changed most, each drawn as two
// curves, A dashed and B solid in the site's colour, not stacked: the gap between them is
// B − A at each moment, and the reader sees which run a change comes from and when.
// (A stacked B − A chart would mix signs in one stack, and a per-moment difference reads a
// shift in time between the runs as growth and shrinkage.)
function drawSiteTimeline() {
  const sites = traces.map(siteOfStack), per = new Map(); // site frame → filtered bytes per trace
  traces.forEach((t, ti) => {
    const r = R[ti], perNode = new Float64Array(t.nNodes);
    for (let j = 0; j < r.length; j++) perNode[t.s[r[j]]] += t.ns[r[j]] * t.bps;
    for (let i = 0; i < t.nNodes; i++) if (perNode[i]) { let v = per.get(sites[ti][i]); if (!v) per.set(sites[ti][i], (v = [0, 0])); v[ti] += perNode[i]; }
  });
  const weight = ([a, b]) => (DIFF ? Math.abs(b - a) : a);
  const top = [...per.entries()].sort((x, y) => weight(y[1]) - weight(x[1])).slice(0, 8).map((x) => x[0]);
  const slot = new Map(top.map((s, k) => [s, k]));
  const K = top.length + 1, dt = DUR / NB;
  const series = traces.map((t, ti) => { // per slot (the last: other sites), live bytes at k*dt
    const r = R[ti], d = Array.from({ length: K }, () => new Float64Array(NB + 2));
    const nodeSlot = new Int32Array(t.nNodes); for (let i = 0; i < t.nNodes; i++) nodeSlot[i] = slot.has(sites[ti][i]) ? slot.get(sites[ti][i]) : K - 1;
    for (let j = 0; j < r.length; j++) {
      const i = r[j]; const k = nodeSlot[t.s[i]]; const x = t.ns[i] * t.bps;
      d[k][Math.min(NB + 1, Math.ceil(t.a[i] / dt))] += x; if (t.f[i] >= 0) d[k][Math.min(NB + 1, Math.ceil(t.f[i] / dt))] -= x;
    }
    return d.map((dd) => { const o = new Float64Array(NB + 1); let acc = 0; for (let k = 0; k <= NB; k++) { acc += dd[k]; o[k] = Math.max(0, acc); } return o; });
  });
  const box = $('site-timeline'); const c = chartFrame(box, 200);
  const only = view.site >= 0 && slot.has(view.site) ? slot.get(view.site) : -1;
  const shown = (q) => only < 0 || q === only;
  const label = (q) => (q < top.length ? siteLabel(top[q]) : 'other sites');
  const maxOf = (ys) => ys.reduce((m, v) => Math.max(m, v), 0);
  let max = 0;
  if (DIFF) { for (const sr of series) for (let q = 0; q < K; q++) if (shown(q)) max = Math.max(max, maxOf(sr[q])); }
  else for (let k = 0; k <= NB; k++) { let sum = 0; for (let q = 0; q < K; q++) if (shown(q)) sum += series[0][q][k]; max = Math.max(max, sum); }
  const y = yAxis(c, max, fmtBytes); xAxes(c, false);
  const stack = new Float64Array(NB + 1);
  for (let q = 0; q < K; q++) {
    if (!shown(q) || !series.some((sr) => maxOf(sr[q]) > 0)) continue;
    const color = PALETTE[q % PALETTE.length];
    if (DIFF) {
      series.forEach((ys, ti) => el('path', { d: linePath(c, ys[q], y), fill: 'none', stroke: color, 'stroke-width': ti ? 2 : 1.5, 'stroke-dasharray': ti ? '' : '5 3', 'data-site': label(q), 'data-trace': ti ? 'B' : 'A', 'data-max': maxOf(ys[q]) }, c.svg));
      continue;
    }
    const next = Float64Array.from(stack); for (let k = 0; k <= NB; k++) next[k] += series[0][q][k];
    let up = linePath(c, next, y);
    for (let k = NB; k >= 0; k--) up += `L${c.x((k * DUR) / NB).toFixed(1)},${y(stack[k]).toFixed(1)}`;
    el('path', { d: up + 'Z', fill: color, 'fill-opacity': 0.75, stroke: 'none', 'data-site': label(q), 'data-max': maxOf(series[0][q]) }, c.svg);
    stack.set(next);
  }
  const leg = $('site-legend'); leg.textContent = '';
  top.concat([-2]).forEach((s, q) => {
    if (q === K - 1 && !series.some((sr) => sr[q].some((v) => v > 0))) return;
    const b = document.createElement('button'); b.type = 'button';
    const figures = DIFF && q < top.length ? ` <span class="hint">A ${fmtBytes(per.get(s)[0])}, B ${fmtBytes(per.get(s)[1])}</span>` : '';
    b.innerHTML = `<span class="swatch" style="background:${PALETTE[q % PALETTE.length]}"></span>${esc(label(q))}${figures}`;
    if (s === view.site) b.classList.add('on'); b.setAttribute('aria-pressed', s === view.site);
    b.onclick = () => { view.site = view.site === s ? -1 : s; drawSiteTimeline(); };
    leg.appendChild(b);
  });
}

// ------------------------------------------------------------------ flame graph
const flame = { zoom: -1, focus: -1, sel: -1, mode: 'flame', root: 'span' };
const ROW = 18;
function colorFor(i) {
  if (DIFF) {
    const a = TREE.tot[0][i], b = TREE.tot[1][i], r = (b - a) / Math.max(a + b, 1e-9);
    const k = Math.min(1, Math.abs(r)); return r >= 0 ? `hsl(0,${30 + 60 * k}%,${85 - 30 * k}%)` : `hsl(215,${30 + 60 * k}%,${85 - 30 * k}%)`;
  }
  const fr = TREE.frame[i]; return fr < 0 ? '#c8ccd4' : COLORS[fr];
}
function drawFlame() {
  const tr = TREE, box = $('flamegraph'); const wv = (i) => (DIFF ? tr.tot[0][i] + tr.tot[1][i] : tr.tot[0][i]);
  const width = Math.max(300, widths.flamegraph - 2 || 700);
  const root = flame.zoom >= 0 && flame.zoom < tr.m ? flame.zoom : 0; if (root === 0) flame.zoom = -1;
  const total = wv(root);
  // layout: x offsets by DFS from root; ancestors of the zoomed node drawn full width
  const xs = new Float64Array(tr.m).fill(-1), ws = new Float64Array(tr.m);
  const anc = []; for (let x = root; x > 0; x = tr.parent[x]) anc.push(x); anc.push(0);
  for (const x of anc) { xs[x] = 0; ws[x] = width; }
  const order = []; const stackN = [root]; let maxDepth = 0;
  while (stackN.length) {
    const i = stackN.pop(); order.push(i); maxDepth = Math.max(maxDepth, tr.depth[i]);
    let x = xs[i];
    const kids = [...tr.kids[i].values()].sort((p, q) => wv(q) - wv(p));
    for (const k of kids) { const kw = total > 0 ? (wv(k) / total) * width : 0; if (kw < 0.4) continue; xs[k] = x; ws[k] = kw; x += kw; stackN.push(k); }
  }
  const H = (maxDepth + 1) * ROW + 4; const icicle = flame.mode === 'icicle';
  const q = $('fg-search').value.trim().toLowerCase(); let matched = 0; const matchedSeen = new Set();
  const all = anc.slice(1).concat(order), dim = new Set(anc.filter((x) => x !== root));
  // One string and one innerHTML: several times faster than an element at a time.
  const parts = [];
  for (const i of all) {
    const d = tr.depth[i], yy = icicle ? d * ROW : H - (d + 1) * ROW;
    const isMatch = q && i > 0 && fnOf(tr.frame[i]).toLowerCase().includes(q);
    if (isMatch) { let dup = false; for (let x = tr.parent[i]; x > 0; x = tr.parent[x]) if (matchedSeen.has(x)) dup = true; matchedSeen.add(i); if (!dup && i !== root) matched += val(tr, i); }
    const cls = [isMatch ? 'match' : '', dim.has(i) ? 'dim' : '', i === flame.sel ? 'sel' : ''].filter(Boolean).join(' ');
    const label = i === 0 ? (DIFF ? 'all (B − A)' : 'all') : frameLabel(tr.frame[i]);
    const text = `${label} — ${fmtM(val(tr, i))}${DIFF ? ` (A ${fmtM(tr.tot[0][i])}, B ${fmtM(tr.tot[1][i])})` : ''}`;
    const title = text + `, ${Math.round(DIFF ? tr.totN[1][i] : tr.totN[0][i])} samples`;
    let h = `<g data-node="${i}" data-parent="${tr.parent[i]}"${cls ? ` class="${cls}"` : ''}><rect x="${xs[i].toFixed(1)}" y="${yy}" width="${Math.max(ws[i] - 0.5, 0.5).toFixed(1)}" height="${ROW - 1}" fill="${colorFor(i)}"/><title>${esc(title)}</title>`;
    if (ws[i] > 40) {
      const maxc = Math.floor((ws[i] - 6) / 6.2); const s = text.length > maxc ? text.slice(0, Math.max(0, maxc - 1)) + '…' : text;
      h += `<text x="${(xs[i] + 3).toFixed(1)}" y="${yy + 12.5}">${esc(s)}</text>`;
    }
    parts.push(h + '</g>');
  }
  box.innerHTML = `<svg xmlns="${SVGNS}" viewBox="0 0 ${width} ${H}" width="${width}" height="${H}" id="flamegraph-svg" data-total="${val(tr, 0)}" data-root="${root}">${parts.join('')}</svg>`;
  if (q) { const base = root === 0 ? val(tr, 0) : val(tr, root); $('fg-match').textContent = `matched ${fmtM(matched)} (${base ? ((100 * matched) / base).toFixed(1) : 0}%, callees included)`; } else $('fg-match').textContent = '';
  $('fg-selected').textContent = flame.sel > 0 && flame.sel < tr.m ? `selected: ${frameLabel(tr.frame[flame.sel])} ${fmtM(val(tr, flame.sel))}` : '';
  $('fg-focus').textContent = flame.focus >= 0 ? `Unfocus ${fnOf(flame.focus)}` : 'Focus selected';
  if (!icicle && flame._scrolled !== H) { box.scrollTop = box.scrollHeight; flame._scrolled = H; }
}
$('flamegraph').addEventListener('click', (e) => {
  const g = e.target.closest('g[data-node]'); if (!g) return; const i = +g.dataset.node;
  flame.sel = i; flame.zoom = i === 0 ? -1 : i; drawFlame();
});
$('flamegraph').addEventListener('keydown', (e) => {
  const tr = TREE; let s = flame.sel > 0 && flame.sel < tr.m ? flame.sel : 0; const icicle = flame.mode === 'icicle';
  const kids = (i) => [...tr.kids[i].values()].sort((p, q) => val(tr, q) - val(tr, p));
  const sib = (d) => { if (!s) return s; const k = kids(tr.parent[s]); const j = k.indexOf(s) + d; return k[Math.max(0, Math.min(k.length - 1, j))]; };
  const deeper = () => kids(s)[0] ?? s, shallower = () => (s ? tr.parent[s] : 0);
  let handled = true;
  switch (e.key) {
    case 'ArrowUp': s = icicle ? shallower() : deeper(); break;
    case 'ArrowDown': s = icicle ? deeper() : shallower(); break;
    case 'ArrowLeft': s = sib(-1); break; case 'ArrowRight': s = sib(1); break;
    case 'Enter': case ' ': flame.zoom = s || -1; break;
    case 'Escape': flame.zoom = -1; break;
    default: handled = false;
  }
  if (handled) { e.preventDefault(); flame.sel = s; drawFlame(); const g = $('flamegraph').querySelector('g.sel'); if (g && g.scrollIntoView) g.scrollIntoView({ block: 'nearest' }); }
});
$('fg-mode').addEventListener('change', () => { flame.mode = $('fg-mode').value; flame._scrolled = -1; drawFlame(); saveView(); });
$('fg-root').addEventListener('change', () => { flame.root = $('fg-root').value; flame.zoom = -1; flame.sel = -1; update(); });
$('fg-search').addEventListener('input', () => drawFlame());
$('fg-reset').addEventListener('click', () => { flame.zoom = -1; drawFlame(); });
$('fg-focus').addEventListener('click', () => {
  if (flame.focus >= 0) flame.focus = -1; else if (flame.sel > 0 && flame.sel < TREE.m) flame.focus = TREE.frame[flame.sel];
  flame.zoom = -1; flame.sel = -1; TREE = buildTree(DIFF ? R : [R[0], null]); drawFlame(); drawFunctions(); drawSites(); drawPoi();
});

// ------------------------------------------------------------------ tables
function table(box, cols, rows, state, onPick) {
  // cols: [{key, label, num, fmt}], rows: arrays of objects; state: {sort, desc, q, sel}
  const q = state.q.toLowerCase();
  let rs = q ? rows.filter((r) => r.label.toLowerCase().includes(q)) : rows.slice();
  const c = cols.find((x) => x.key === state.sort) || cols[1];
  rs.sort((a, b) => { const x = a[c.key], y = b[c.key]; const r = typeof x === 'string' ? x.localeCompare(y) : x - y; return state.desc ? -r : r; });
  const shown = rs.slice(0, D.top);
  let h = '<table><thead><tr>' + cols.map((x) => `<th scope="col" tabindex="0" data-key="${x.key}" class="${x.num ? 'n' : ''} ${x.cls || ''}" aria-sort="${x.key === c.key ? (state.desc ? 'descending' : 'ascending') : 'none'}">${esc(x.label)}</th>`).join('') + '</tr></thead><tbody>';
  for (const r of shown) h += `<tr tabindex="0" data-id="${r.id}" class="${r.id === state.sel ? 'sel' : ''}">` + cols.map((x) => `<td class="${x.num ? 'n' : x.cls0 || ''} ${x.cls || ''} ${x.low && x.low(r) ? 'low' : ''}">${x.fmt ? x.fmt(r[x.key], r) : esc(r[x.key])}</td>`).join('') + '</tr>';
  h += '</tbody></table>';
  if (rs.length > shown.length) h += `<p class="hint">${rs.length - shown.length} more rows; use the filter box.</p>`;
  box.innerHTML = h;
  const resort = (th) => { const k = th.dataset.key; if (state.sort === k) state.desc = !state.desc; else { state.sort = k; state.desc = k !== 'label'; } table(box, cols, rows, state, onPick); box.querySelector(`th[data-key="${k}"]`).focus(); };
  box.querySelectorAll('th').forEach((th) => { th.onclick = () => resort(th); th.onkeydown = (e) => { if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); resort(th); } }; });
  box.querySelectorAll('tbody tr').forEach((tr) => { const pick = () => onPick && onPick(+tr.dataset.id); tr.onclick = pick; tr.onkeydown = (e) => { if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); pick(); } }; });
}
const interval = (n, bps) => { const [lo, hi] = poisson95(n); return [lo * bps, hi * bps]; };
const sitesState = { sort: 'v', desc: true, q: '', sel: -1 };
function siteRows() {
  const tr = TREE; const by = new Map();
  for (let i = 0; i < tr.m; i++) { // the root holds what has no frame to show
    if (!(tr.selfB[0][i] || tr.selfB[1][i])) continue;
    const fr = i ? tr.frame[i] : NO_SITE; let r = by.get(fr);
    if (!r) { r = { id: fr, label: siteLabel(fr), a: 0, b: 0, na: 0, nb: 0, blocks: 0 }; by.set(fr, r); }
    r.a += tr.selfW[0][i]; r.b += tr.selfW[1][i]; r.na += tr.selfN[0][i]; r.nb += tr.selfN[1][i]; r.blocks += tr.selfB[0][i] + tr.selfB[1][i];
  }
  const total = Math.abs(val(tr, 0)) || 1;
  return [...by.values()].map((r) => {
    const v = DIFF ? r.b - r.a : r.a, n = DIFF ? r.nb : r.na;
    const bps = F.measure === 'count' ? v / Math.max(n, 1e-9) : B.bps;
    let lo, hi;
    if (DIFF) { const half = Z * Math.sqrt(r.na + r.nb) * (F.measure === 'count' ? Math.abs(v) / Math.max(r.na + r.nb, 1e-9) : B.bps); lo = v - half; hi = v + half; }
    else [lo, hi] = interval(r.na, F.measure === 'count' ? r.a / Math.max(r.na, 1e-9) : A.bps);
    return Object.assign(r, { v, n, lo, hi, pct: (100 * v) / total, samples: DIFF ? r.na + r.nb : r.na });
  });
}
function drawSites() {
  const rows = siteRows();
  const cols = [
    { key: 'label', label: 'site', cls0: 'site' },
    { key: 'v', label: DIFF ? 'B − A' : F.measure === 'count' ? 'objects' : 'bytes', num: true, fmt: (v, r) => `<span class="${DIFF ? (v > 0 ? 'pos' : 'neg') : ''}">${fmtM(v)}</span>`, low: (r) => r.samples < LOW },
    { key: 'lo', label: '95% interval', num: true, cls: 'interval', fmt: (v, r) => `${fmtM(r.lo)} – ${fmtM(r.hi)}` },
    { key: 'pct', label: '%', num: true, fmt: (v) => v.toFixed(1) },
    { key: 'samples', label: 'samples', num: true },
    { key: 'blocks', label: 'blocks', num: true },
  ];
  if (DIFF) cols.splice(1, 0, { key: 'a', label: 'A', num: true, fmt: fmtM }, { key: 'b', label: 'B', num: true, fmt: fmtM });
  table($('sites'), cols, rows, sitesState, (id) => { sitesState.sel = id; view.site = id; drawSites(); drawSiteTimeline(); $('site-timeline').scrollIntoView({ block: 'nearest' }); });
  const note = rows.some((r) => r.samples < LOW) ? `<p class="hint"><span class="low"></span> fewer than ${LOW} samples: the estimate is rough. Intervals: 95%, Poisson in the sample count.</p>` : '<p class="hint">Intervals: 95%, Poisson in the sample count.</p>';
  $('sites').insertAdjacentHTML('beforeend', note);
}
// Function tables: inclusive (once per stack, recursion counted once) and self, with the
// selected function's callees (top-down) or callers (bottom-up).
const calleesState = { sort: 'total', desc: true, q: '', sel: -1 }, callersState = { sort: 'self', desc: true, q: '', sel: -1 };
function functionStats() {
  const tr = TREE, inc = new Map(), self = new Map(), onPath = new Map();
  const V = (ti, i) => tr.tot[ti][i], S = (ti, i) => tr.selfW[ti][i];
  const add = (m, k, d) => { let r = m.get(k); if (!r) m.set(k, (r = [0, 0])); r[0] += d[0]; r[1] += d[1]; };
  // iterative DFS keeping the set of frames on the path
  const stk = [[0, 0]];
  while (stk.length) {
    const top = stk[stk.length - 1]; const [i, state] = top;
    const fr = tr.frame[i];
    if (state === 0) {
      top[1] = 1;
      if (i > 0) { const c = onPath.get(fr) || 0; if (!c) add(inc, fr, [V(0, i), V(1, i)]); onPath.set(fr, c + 1); add(self, fr, [S(0, i), S(1, i)]); }
      for (const k of tr.kids[i].values()) stk.push([k, 0]);
    } else { stk.pop(); if (i > 0) onPath.set(fr, onPath.get(fr) - 1); }
  }
  return { inc, self };
}
function neighbours(fr, callees) {
  const tr = TREE, out = new Map();
  for (let i = 1; i < tr.m; i++) {
    if (tr.frame[i] !== fr) continue;
    if (callees) for (const k of tr.kids[i].values()) { const r = out.get(tr.frame[k]) || [0, 0]; r[0] += tr.tot[0][k]; r[1] += tr.tot[1][k]; out.set(tr.frame[k], r); }
    else { const p = tr.parent[i]; const key = p > 0 ? tr.frame[p] : -1; const r = out.get(key) || [0, 0]; r[0] += tr.tot[0][i]; r[1] += tr.tot[1][i]; out.set(key, r); }
  }
  return [...out.entries()].map(([k, r]) => ({ label: k < 0 ? '(root)' : frameLabel(k), v: DIFF ? r[1] - r[0] : r[0] })).sort((a, b) => Math.abs(b.v) - Math.abs(a.v));
}
function drawFunctions() {
  const { inc, self } = functionStats();
  const rows = [...inc.keys()].map((fr) => { const i = inc.get(fr), s = self.get(fr) || [0, 0]; return { id: fr, label: frameLabel(fr), total: DIFF ? i[1] - i[0] : i[0], self: DIFF ? s[1] - s[0] : s[0] }; });
  const cols = [{ key: 'label', label: 'function', cls0: 'fn' }, { key: 'total', label: 'total', num: true, fmt: fmtM }, { key: 'self', label: 'self', num: true, fmt: fmtM }];
  for (const [box, st, callees] of [[$('callees'), calleesState, true], [$('callers'), callersState, false]]) {
    const render = () => {
      table(box, cols, rows, st, (id) => { st.sel = st.sel === id ? -1 : id; render(); });
      if (st.sel >= 0 && inc.has(st.sel)) {
        const list = neighbours(st.sel, callees);
        box.insertAdjacentHTML('afterbegin', `<div class="sub"><strong>${callees ? 'Callees' : 'Callers'} of <span class="mono">${esc(frameLabel(st.sel))}</span></strong>${list.length ? '<table>' + list.slice(0, 50).map((r) => `<tr><td class="fn">${esc(r.label)}</td><td class="n">${fmtM(r.v)}</td></tr>`).join('') + '</table>' : ' (none)'}</div>`);
      }
    };
    render();
  }
}
for (const [id, st, fn] of [['sites-search', sitesState, () => drawSites()], ['callees-search', calleesState, () => drawFunctions()], ['callers-search', callersState, () => drawFunctions()]])
  $(id).addEventListener('input', () => { st.q = $(id).value; fn(); });

// ------------------------------------------------------------------ lifetimes
function lifetimeBins() { const edges = [0]; for (let e = 1; e <= Math.max(10, DUR * 10); e *= 10) edges.push(e); return edges; }
function drawLifetimes() {
  const edges = lifetimeBins(), nb = edges.length; // bin k: [edges[k], edges[k+1]); last: never freed
  const bins = traces.map(() => new Float64Array(nb + 1));
  const count = F.measure === 'count';
  R.forEach((r, ti) => {
    const t = traces[ti], bin = bins[ti], { f, a, ns, obj, bps } = t;
    for (let j = 0; j < r.length; j++) {
      const i = r[j], x = count ? obj[i] : ns[i] * bps;
      if (f[i] < 0) { bin[nb] += x; continue; }
      // Bin k ≥ 1 holds [10^(k−1), 10^k): log10 gives it, the loops correct its rounding.
      const l = f[i] - a[i]; let k = l < 1 ? 0 : Math.min(nb - 1, Math.floor(Math.log10(l)) + 1);
      while (k + 1 < nb && l >= edges[k + 1]) k++; while (k > 0 && l < edges[k]) k--; bin[k] += x;
    }
  });
  const v = DIFF ? bins[1].map((x, k) => x - bins[0][k]) : bins[0];
  const box = $('lifetimes'); const width = Math.max(300, widths.lifetimes || 700), height = 190, m = { l: 62, r: 10, t: 14, b: 34 };
  box.textContent = ''; const svg = el('svg', { viewBox: `0 0 ${width} ${height}`, height, id: 'lifetimes-svg' }, box);
  const max = Math.max(...v.map(Math.abs), 1), bw = (width - m.l - m.r) / (nb + 1), ph = height - m.t - m.b;
  const y = (x) => m.t + ph - (Math.abs(x) / max) * ph;
  const labels = edges.map((e, k) => (k === 0 ? '< 1µs' : `${fmtTime(e)}–${fmtTime(e * 10)}`)); labels.push('never freed');
  for (let k = 0; k <= nb; k++) {
    const g = el('g', { 'data-bin': labels[k], 'data-value': v[k] }, svg);
    el('rect', { x: m.l + k * bw + 1, y: y(v[k]), width: Math.max(1, bw - 2), height: m.t + ph - y(v[k]), fill: k === nb ? '#d9480f' : v[k] < 0 ? '#2b8a3e' : '#1f5fbf' }, g);
    el('title', {}, g).textContent = `${labels[k]}: ${fmtM(v[k])}`;
    if (v[k]) el('text', { x: m.l + k * bw + bw / 2, y: y(v[k]) - 2, 'text-anchor': 'middle' }, g).textContent = fmtM(v[k]);
    if (bw > 34 || k % 2 === 0 || k === nb) el('text', { x: m.l + k * bw + bw / 2, y: height - (k % 2 ? 4 : 18), 'text-anchor': 'middle' }, svg).textContent = k === nb ? 'never' : k === 0 ? '<1µs' : fmtTime(edges[k]);
  }
  el('text', { x: m.l - 4, y: m.t + 10, 'text-anchor': 'end' }, svg).textContent = fmtM(max);
}
function shortThreshold() { return niceStep(Math.max(1, DUR / 100)) === DUR / 100 ? DUR / 100 : niceStep(DUR / 100) / 2; }
$('lt-short').addEventListener('click', () => { setField('f-life-max', fmtTime(shortThreshold())); setField('f-collected', ''); applyForm(); });
$('lt-never').addEventListener('click', () => { setField('f-collected', 'never'); setField('f-life-max', ''); applyForm(); });
$('lt-clear').addEventListener('click', () => { setField('f-collected', ''); setField('f-life-max', ''); setField('f-life-min', ''); applyForm(); });
$('lt-short').title = `lifetime under ${fmtTime(shortThreshold())} (1/100 of the trace, rounded)`;

// ------------------------------------------------------------------ points of interest
// Stacks: walk down the display tree from the root; a node that carries ≥ 5% of the
// filtered total and has no single child carrying ≥ 80% of it is a point of interest.
// Functions: the fewest sites (self) that explain 80% of the total.
function drawPoi() {
  const tr = TREE, total = Math.abs(val(tr, 0)); const box = $('poi');
  if (!total) { box.innerHTML = '<p>No allocations match the filter.</p>'; return; }
  const found = []; const todo = [0];
  while (todo.length && found.length < 12) {
    const i = todo.shift(); const w = Math.abs(val(tr, i));
    const kids = [...tr.kids[i].values()].filter((k) => Math.abs(val(tr, k)) >= 0.05 * total).sort((p, q) => Math.abs(val(tr, q)) - Math.abs(val(tr, p)));
    if (kids.length && Math.abs(val(tr, kids[0])) >= 0.8 * w) { todo.push(kids[0]); continue; }
    // Threads and spans are where the stacks run, not points of interest themselves.
    if (i > 0 && !FR.pseudo[tr.frame[i]]) found.push(i);
    for (const k of kids) todo.push(k);
  }
  // Only the innermost of nested ones: each figure includes its callees', so the stacks shown
  // are disjoint and their shares add up to at most the whole.
  const isFound = new Set(found), nested = new Set();
  for (const i of found) for (let x = tr.parent[i]; x > 0; x = tr.parent[x]) if (isFound.has(x)) nested.add(x);
  const out = found.filter((i) => !nested.has(i));
  const path = (i) => { const p = []; for (let x = i; x > 0; x = tr.parent[x]) p.push(fnOf(tr.frame[x])); return p.reverse(); };
  const sites = siteRows().sort((a, b) => Math.abs(b.v) - Math.abs(a.v)); let acc = 0; const fsites = [];
  for (const s of sites) { if (acc >= 0.8 * total || fsites.length >= 8) break; fsites.push(s); acc += Math.abs(s.v); }
  let h = '<h3>Stacks</h3><p class="hint">No stack below holds another; each figure includes its callees’, as a share of the filtered total.</p><ol id="poi-stacks">';
  for (const i of out.slice(0, 8)) {
    const p = path(i), v = val(tr, i);
    h += `<li><a href="#flamegraph" data-node="${i}">${esc(frameLabel(tr.frame[i]))}</a> — <strong>${fmtM(v)}</strong> (${((100 * v) / total).toFixed(1)}%)<br><span class="hint mono">${esc(p.length > 6 ? p.slice(0, 2).join(' → ') + ' → … → ' + p.slice(-3).join(' → ') : p.join(' → '))}</span></li>`;
  }
  h += '</ol><h3>Sites that explain ' + ((100 * acc) / total).toFixed(0) + '% of it</h3><ol id="poi-functions">';
  for (const s of fsites) h += `<li><span class="mono">${esc(s.label)}</span> — <strong>${fmtM(s.v)}</strong> (${((100 * s.v) / total).toFixed(1)}%)${s.samples < LOW ? ' <span class="low">few samples</span>' : ''}</li>`;
  box.innerHTML = h + '</ol>';
  box.querySelectorAll('a[data-node]').forEach((a) => { a.onclick = (e) => { e.preventDefault(); flame.sel = +a.dataset.node; flame.zoom = flame.sel; drawFlame(); $('flamegraph').focus(); $('flamegraph').scrollIntoView({ block: 'nearest' }); }; });
}

// ------------------------------------------------------------------ start
viewDefaults = Object.fromEntries(VIEW_IDS.map((id) => [id, controlValue($(id))]));
loadView(); readForm(); update();
window.addEventListener('hashchange', () => { loadView(); flame.zoom = -1; flame.sel = -1; if (readForm()) update(); });
let rz = 0; window.addEventListener('resize', () => { clearTimeout(rz); rz = setTimeout(() => { measure(); drawTimeline(); drawSiteTimeline(); drawFlame(); drawLifetimes(); }, 150); });
$('status').textContent = DIFF ? `Diff: B (${B.T.name}) − A (${A.T.name}), frames matched by function (file, line and name; unnamed threads as one, thread-*).` : `${traces[0].T.name}: ${traces[0].n.toLocaleString('en')} sampled blocks.`;
window.__memtraceReady = { open_ms: performance.now() - T0, since_nav_ms: performance.now() };
document.body.dataset.ready = '1';
})().catch((e) => { document.getElementById('status').textContent = 'Error: ' + e.message; throw e; });
