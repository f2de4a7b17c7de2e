// Browser test of the report page (run by tests/integration/report_browser.rs, which
// builds the known-answer trace and its pages), in Chromium and in Firefox: drag on the
// chart, 'live at peak', a lifetime bound, the figures in every view, the same figures from
// `memtrace hotspots` with the flags the page shows, no console error, screenshots at 760
// and 1400 px. puppeteer-core drives both Debian browsers: Chromium over the DevTools
// protocol, Firefox over WebDriver BiDi (no geckodriver, no browser download).
// Env: MEMTRACE_BIN, REPORT_TRACE, REPORT_HTML, DIFF_HTML, THIN_HTML, STARTUP_TRACE,
// STARTUP_HTML, HOSTILE_HTML, TOKIO_HTML (the tokio example's trace's page), ARTIFACTS (screenshots), BROWSERS (default 'chromium,firefox'), CHROMIUM
// (default /usr/bin/chromium), FIREFOX (default /usr/bin/firefox-esr); BIG_REPORT
// (optional: a report to time opening and filtering).
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import puppeteer from 'puppeteer-core';

const env = (k) => { const v = process.env[k]; if (!v) throw new Error(`${k} is not set: run this through cargo test (tests/integration/report_browser.rs)`); return v; };
const artifacts = process.env.ARTIFACTS || mkdtempSync(path.join(tmpdir(), 'report-artifacts-'));
mkdirSync(artifacts, { recursive: true });
const KiB = 1024;
const LAUNCH = {
  chromium: () => ({ browser: 'chrome', executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'] }),
  firefox: () => ({ browser: 'firefox', executablePath: process.env.FIREFOX || '/usr/bin/firefox-esr' }),
};
const BROWSERS = (process.env.BROWSERS || 'chromium,firefox').split(',').filter(Boolean);

// Each page's console errors and warnings, uncaught exceptions, dialogs (an `alert` that
// markup in the data would run) and requests for anything but the file itself.
function watch(page) {
  const errors = [];
  page.on('dialog', async (d) => { errors.push(`dialog: ${d.message()}`); await d.dismiss(); });
  page.on('console', (m) => { if (['error', 'warn', 'warning'].includes(m.type())) errors.push(`console.${m.type()}: ${m.text()}`); });
  page.on('pageerror', (e) => errors.push(`pageerror: ${e.message}`));
  page.on('request', (r) => { if (!/^(file|data|blob):/.test(r.url())) errors.push(`network request: ${r.url()}`); });
  return errors;
}
// `memtrace hotspots TRACE` with the flags the page shows for its filter (and `more`): its lines.
async function hotspots(page, trace, ...more) {
  const words = [...(await text(page, '#cli-equivalent')).matchAll(/'([^']*)'|(\S+)/g)].map((m) => m[1] ?? m[2]);
  assert.deepEqual(words.slice(0, 3), ['memtrace', 'hotspots', 'TRACE']);
  return execFileSync(env('MEMTRACE_BIN'), ['hotspots', trace, ...words.slice(3), ...more]).toString().split('\n');
}
// Scroll to an element and let it render, as a reader would before reading it (Firefox
// gives no innerText for a section that content-visibility: auto has not rendered yet).
const reveal = (page, sel) => page.evaluate(async (sel) => {
  document.querySelector(sel).scrollIntoView({ block: 'nearest' });
  await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)));
}, sel);
// Whether the page's figure `shown` ('3.45 KiB') is `bytes` to the digits it shows.
function showsBytes(shown, bytes) {
  const [, num, unit] = /^([\d.]+) (B|KiB|MiB|GiB)$/.exec(shown);
  const digits = (num.split('.')[1] || '').length;
  return Math.abs(bytes / 1024 ** ['B', 'KiB', 'MiB', 'GiB'].indexOf(unit) - +num) <= 0.5 * 10 ** -digits;
}
// Click an element once it is in view and rendered: a click aimed while the sections that
// content-visibility: auto skipped are laid out may land beside it.
const click = async (page, sel) => { await reveal(page, sel); await page.click(sel); };
// The page is read with page.evaluate and querySelector: puppeteer's element handles cost
// a round trip each, some 100 ms per $$eval in Firefox.
const all = (page, sel, map) => page.evaluate((sel, map) => [...document.querySelectorAll(sel)].map(new Function('e', `return ${map}`)), sel, map);
const text = async (page, sel) => { await reveal(page, sel); return page.evaluate((sel) => { const e = document.querySelector(sel); return e instanceof HTMLElement ? e.innerText : e.textContent; }, sel); };
const cells = async (page, sel) => { await reveal(page, sel); return all(page, sel, '[...e.cells].map((c) => c.innerText)'); };
const attr = (page, sel, name) => page.evaluate((sel, name) => document.querySelector(sel).getAttribute(name), sel, name);
const value = (page, sel) => page.evaluate((sel) => document.querySelector(sel).value, sel);
const count = (page, sel) => page.evaluate((sel) => document.querySelectorAll(sel).length, sel);
// Replace a field's text as one edit (one 'input' event, as pasting does): typing it key by
// key could apply a prefix ('5' of '500ms') before the rest arrives.
async function fill(page, sel, v) {
  await page.evaluate((sel, v) => { const e = document.querySelector(sel); e.focus(); e.select(); document.execCommand(v ? 'insertText' : 'delete', false, v); }, sel, v);
}
// Wait until the page shows the filter as these `memtrace hotspots` flags (the filter is
// applied as a whole: every view is drawn in the task that prints them).
const until = (page, flags) => page.waitForFunction((s) => document.getElementById('cli-equivalent').textContent === s, {}, `memtrace hotspots TRACE ${flags}`);
async function settled(page, before) { await page.waitForFunction((n) => +document.body.dataset.updates > n, {}, before); }
const updates = (page) => page.evaluate(() => +document.body.dataset.updates);
// `file` may carry a view in its fragment (`page.html#live=`).
async function open(browser, file) {
  const page = await browser.newPage(); const errors = watch(page);
  await page.setViewport({ width: 1400, height: 1000 });
  await page.goto(file.startsWith('file:') ? file : 'file://' + file);
  await page.waitForSelector('body[data-ready="1"]', { timeout: 60000 });
  return { page, errors };
}
// Back to the page's default view (live at the peak), then to everything allocated.
async function allocatedAnyTime(page) {
  let n = await updates(page); await page.click('#f-reset'); await settled(page, n);
  n = await updates(page); await page.click('#q-allocated'); await settled(page, n);
  assert.equal(await page.evaluate(() => document.getElementById('cli-equivalent').textContent), 'memtrace hotspots TRACE');
}
// The view in the page's URL: its fragment.
const fragment = (page) => page.evaluate(() => location.hash);
// The labels of the flame graph's frames (its titles up to the figures).
const flameLabels = async (page) => (await all(page, '#flamegraph-svg g title', 'e.textContent')).map((t) => t.split(' — ')[0]);

for (const name of BROWSERS) describe(name, () => {
  let browser;
  before(async () => { browser = await puppeteer.launch({ headless: true, ...LAUNCH[name]() }); });
  after(async () => { await browser?.close(); });
  // A screenshot of the whole page, taken in a viewport as tall as the page: Firefox's
  // full-page capture leaves out the sections content-visibility: auto has not rendered.
  async function shot(page, file, fullPage = true) {
    const vp = page.viewport(), out = path.join(artifacts, `${file}-${name}.png`);
    if (!fullPage) return page.screenshot({ path: out });
    await page.setViewport({ ...vp, height: await page.evaluate(() => document.documentElement.scrollHeight) });
    await page.evaluate(() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r))));
    await page.screenshot({ path: out });
    await page.setViewport(vp);
  }
  // At 760 px (after the page has redrawn for it): a screenshot, no horizontal scrolling and
  // no text under 11 px.
  async function narrow(page, file) {
    await page.setViewport({ width: 760, height: 1000 }); await new Promise((r) => setTimeout(r, 400));
    await shot(page, file);
    const layout = await page.evaluate(() => ({ sw: document.documentElement.scrollWidth, minFont: Math.min(...[...document.querySelectorAll('td, th, label, p, button, legend')].filter((e) => e.offsetParent).map((e) => parseFloat(getComputedStyle(e).fontSize))) }));
    assert.ok(layout.sw <= 760, `page is ${layout.sw}px wide at 760`);
    assert.ok(layout.minFont >= 11, `smallest text ${layout.minFont}px`);
    await columnsReachable(page, 760);
    // Narrower still, the table no longer fits its box: it scrolls sideways.
    await page.setViewport({ width: 420, height: 1000 }); await new Promise((r) => setTimeout(r, 400));
    assert.ok(await columnsReachable(page, 420), 'the sites table fits in 420 px: the scroll is not tested');
    await page.setViewport({ width: 760, height: 1000 }); await new Promise((r) => setTimeout(r, 400));
  }
  // Every column of the sites table is shown, and one the box cannot hold is a sideways scroll
  // away: scrolled to its end, the box shows the last column whole. Whether it had to scroll.
  async function columnsReachable(page, width) {
    await reveal(page, '#sites');
    const columns = await page.evaluate(() => {
      const box = document.getElementById('sites'), ths = [...box.querySelectorAll('thead th')];
      const shown = ths.map((th) => th.getBoundingClientRect().width > 0 && getComputedStyle(th).display !== 'none');
      box.scrollLeft = box.scrollWidth;
      const right = box.getBoundingClientRect().right, last = ths[ths.length - 1].getBoundingClientRect().right;
      const out = { shown, labels: ths.map((th) => th.textContent), lastInside: last <= right + 1, scrolls: box.scrollWidth > box.clientWidth, byHand: ['auto', 'scroll'].includes(getComputedStyle(box).overflowX) };
      box.scrollLeft = 0;
      return out;
    });
    assert.ok(columns.shown.every(Boolean), `hidden columns at ${width}: ${columns.labels.filter((_, i) => !columns.shown[i])}`);
    // A script can scroll a box whose overflow is hidden; a reader cannot.
    assert.ok(columns.lastInside && (columns.byHand || !columns.scrolls), `the last column of the sites table cannot be scrolled to at ${width}`);
    return columns.scrolls;
  }

  test('known-answer report', async () => {
    const trace = env('REPORT_TRACE'), html = env('REPORT_HTML');
    const { page, errors } = await open(browser, html);
    try {
      for (const id of ['timeline', 'filters', 'flamegraph', 'sites', 'site-timeline', 'callees', 'callers', 'lifetimes', 'poi']) assert.ok(await count(page, '#' + id), id);
      const history0 = await page.evaluate(() => history.length);
      // The page opens on what is live at the peak: the index and the cache, 660 KiB, with
      // the default view's URL (no fragment).
      assert.equal(await value(page, '#f-live'), 'peak');
      assert.equal(await attr(page, '#q-peak', 'aria-pressed'), 'true');
      assert.match(await text(page, '#filter-totals'), /70 of 170 blocks, 660 KiB \(660 samples\)/);
      assert.equal(await text(page, '#cli-equivalent'), 'memtrace hotspots TRACE --live-at peak');
      assert.equal(+(await attr(page, '#flamegraph-svg', 'data-total')), 660 * KiB);
      assert.equal(await fragment(page), '');
      // The time axis starts at 0 in the unit of the trace's length (600 ms), and the chart
      // keeps room after the trace's end for what is left then (the cache, never freed).
      const ticks = await all(page, '#timeline-svg .axis text', 'e.textContent');
      assert.ok(ticks.includes('0 ms') && ticks.includes('200 ms') && !ticks.some((t) => /µs/.test(t)), `${ticks}`);
      const end = await page.evaluate(() => { const s = document.getElementById('timeline-svg'); return { x1: +s.dataset.x1, vw: s.viewBox.baseVal.width, endLive: +s.dataset.endLive }; });
      assert.equal(end.endLive, 160 * KiB);
      assert.ok(end.x1 + 10 <= end.vw - 12, `the trace ends at ${end.x1} of ${end.vw} px`);
      // Everything allocated, a click away.
      let n = await updates(page); await click(page, '#q-allocated'); await settled(page, n);
      assert.equal(await value(page, '#f-live'), '');
      assert.equal(await attr(page, '#q-allocated', 'aria-pressed'), 'true');
      assert.equal(await fragment(page), '#live=');
      // Unfiltered: 1060 KiB allocated, peak 660 KiB at 319 ms.
      assert.match(await text(page, '#peak-label'), /peak 660 KiB at 319ms/);
      // Points of interest: the stacks where the bytes split, none inside another (main and
      // app::run would hold the others'), their shares adding up to the whole, and saying so.
      const poi = await all(page, '#poi-stacks li', "[e.querySelector('a').textContent, +/\\(([\\d.]+)%\\)/.exec(e.textContent)[1]]");
      assert.deepEqual(poi.map((p) => p[0]).sort(), ['app::build_index (src/index.rs:50)', 'app::cache::insert (src/cache.rs:60)', 'app::load_config (src/config.rs:30)']);
      assert.ok(Math.abs(poi.reduce((sum, p) => sum + p[1], 0) - 100) < 0.2, `${poi}`);
      assert.match(await text(page, '#poi'), /includes its callees/);
      assert.equal(+(await attr(page, '#flamegraph-svg', 'data-total')), 1060 * KiB);
      assert.match(await text(page, '#filter-totals'), /170 of 170 blocks, 1\.04 MiB \(1060 samples\)/);
      // The live curve reaches the peak it labels (which falls between two of its points), and
      // with no filter set its legend says so.
      assert.equal(+(await attr(page, '#timeline-svg', 'data-live-max')), +(await attr(page, '#timeline-svg', 'data-peak-bytes')));
      assert.equal(+(await attr(page, '#timeline-svg', 'data-peak-bytes')), 660 * KiB);
      assert.match(await text(page, '#timeline-legend'), /^live: max 660 KiB$/);

      // Drag on the chart from 150 ms to 450 ms: 'allocated between'.
      const box = await (await page.$('#timeline-svg')).boundingBox();
      const d = await page.evaluate(() => ({ ...document.getElementById('timeline-svg').dataset, vw: document.getElementById('timeline-svg').viewBox.baseVal.width }));
      const px = (t) => box.x + ((+d.x0 + (t / +d.t1) * (+d.x1 - +d.x0)) / d.vw) * box.width;
      const y = box.y + box.height / 2;
      n = await updates(page);
      await page.mouse.move(px(150e3), y); await page.mouse.down(); await page.mouse.move(px(300e3), y, { steps: 5 }); await page.mouse.move(px(450e3), y, { steps: 5 }); await page.mouse.up();
      await settled(page, n);
      const lo = await value(page, '#f-alloc-lo'), hi = await value(page, '#f-alloc-hi');
      assert.match(lo, /^1[45]\d(\.\d+)?ms$/); assert.match(hi, /^4[45]\d(\.\d+)?ms$/);
      assert.equal(await count(page, '#timeline rect.selection'), 1);
      assert.match(await text(page, '#filter-totals'), /70 of 170 blocks, 660 KiB \(660 samples\)/);

      // 'live at peak'.
      n = await updates(page); await page.select('#f-live', 'peak'); await settled(page, n);
      assert.match(await text(page, '#filter-totals'), /70 of 170 blocks, 660 KiB/);
      assert.equal(await count(page, '#timeline line.live-at'), 1);
      // A lifetime bound: under 500 ms leaves build_index (freed after 351–400 ms) and drops
      // the never-freed cache.
      n = await updates(page); await fill(page, '#f-life-max', '500ms'); await settled(page, n);
      assert.match(await text(page, '#filter-totals'), /50 of 170 blocks, 500 KiB \(500 samples\)/);
      assert.match(await text(page, '#cli-equivalent'), /--live-at peak --lifetime-under 500ms/);
      // The view is in the URL, replaced rather than pushed (Back leaves the page), and a page
      // opened at that URL shows the same view, flame graph mode and roots included.
      n = await updates(page); await page.select('#fg-root', 'thread'); await settled(page, n);
      await page.select('#fg-mode', 'icicle');
      const url = await page.evaluate(() => location.href), view = await fragment(page);
      for (const part of ['alloc-lo=', 'alloc-hi=', 'life-max=500ms', 'fg-mode=icicle', 'fg-root=thread']) assert.ok(view.includes(part), `${part} in ${view}`);
      assert.ok(!view.includes('live='), `the default, live at the peak, is left out: ${view}`);
      assert.equal(await page.evaluate(() => history.length), history0);
      // Read before the second page comes to the front: a page behind gets no animation frames.
      const controls = ['#f-alloc-lo', '#f-alloc-hi', '#f-live', '#f-life-max', '#fg-mode', '#fg-root'];
      const shown = { values: await Promise.all(controls.map((sel) => value(page, sel))), cli: await text(page, '#cli-equivalent') };
      const again = await open(browser, url);
      try {
        assert.deepEqual(await Promise.all(controls.map((sel) => value(again.page, sel))), shown.values);
        assert.equal(await text(again.page, '#cli-equivalent'), shown.cli);
        assert.match(await text(again.page, '#filter-totals'), /50 of 170 blocks, 500 KiB \(500 samples\)/);
        assert.equal(await fragment(again.page), view);
        assert.deepEqual(again.errors, []);
      } finally { await again.page.close(); }
      await page.bringToFront();
      await page.select('#fg-mode', 'flame'); n = await updates(page); await page.select('#fg-root', 'span'); await settled(page, n);

      // Flame graph: the root and the chain main → app::run → app::build_index, 500 KiB each.
      assert.equal(+(await attr(page, '#flamegraph-svg', 'data-total')), 500 * KiB);
      const titles = await all(page, '#flamegraph-svg g title', 'e.textContent');
      for (const f of ['all — 500 KiB', 'main (src/main.rs:10) — 500 KiB', 'app::run (src/app.rs:40) — 500 KiB', 'app::build_index (src/index.rs:50) — 500 KiB'])
        assert.ok(titles.some((t) => t.startsWith(f)), `${f} in ${titles}`);
      assert.ok(!titles.some((t) => t.includes('__rust_alloc')), 'allocator frames trimmed');
      // Sites table: one site with its 95% interval (500 samples: 457–546 KiB).
      const rows = await cells(page, '#sites tbody tr');
      assert.equal(rows.length, 1);
      assert.deepEqual(rows[0].slice(0, 6), ['app::build_index (src/index.rs:50)', '500 KiB', '457 KiB – 546 KiB', '100.0', '500', '50']);
      // Top-down and bottom-up tables.
      const callees = await cells(page, '#callees tbody tr');
      assert.deepEqual(callees.find((r) => r[0].startsWith('main')), ['main (src/main.rs:10)', '500 KiB', '0 B']);
      const callers = await cells(page, '#callers tbody tr');
      assert.deepEqual(callers[0], ['app::build_index (src/index.rs:50)', '500 KiB', '500 KiB']);
      await click(page, '#callers tbody tr:first-child');
      assert.match(await text(page, '#callers .sub'), /Callers of app::build_index[\s\S]*app::run \(src\/app\.rs:40\)\s+500 KiB/);
      // Chart: the filtered series peaks at 500 KiB. Lifetimes: all in 100ms–1s.
      assert.equal(+(await attr(page, '#timeline-svg', 'data-filtered-max')), 500 * KiB);
      assert.match(await text(page, '#timeline-legend'), /filtered: max 500 KiB/);
      assert.equal(+(await attr(page, '#lifetimes g[data-bin="100ms–1s"]', 'data-value')), 500 * KiB);
      // Points of interest.
      assert.match(await text(page, '#poi-functions'), /app::build_index \(src\/index\.rs:50\) — 500 KiB \(100\.0%\)/);

      // Same numbers on the command line, with the flags the page shows for its filter.
      let cli = await hotspots(page, trace);
      assert.match(cli[0], /total 500\.0 KiB\b.* in 500 samples, 50 sampled allocations$/, cli[0]);
      const sites = cli.filter((l) => l.endsWith(')'));
      assert.equal(sites.length, 1, cli.join('\n'));
      assert.match(sites[0], /^ *500\.0 KiB .* 500 .*app::build_index \(src\/index\.rs:50\)$/, sites[0]);

      // A view typed into the address bar (a new fragment) is opened too: the
      // fields it leaves out go back to their defaults.
      n = await updates(page); await page.evaluate(() => { location.hash = '#live=end'; }); await settled(page, n);
      assert.equal(await value(page, '#f-live'), 'end'); assert.equal(await value(page, '#f-life-max'), '');
      assert.match(await text(page, '#filter-totals'), /20 of 170 blocks, 160 KiB/);

      // Figures from fewer than 10 samples are marked: the first two configuration blocks,
      // 4 samples each. Their 95% interval is the exact Poisson one, 3.45–15.8 samples
      // (Byar's approximation would say 3.44), and the command line's bounds are the same.
      await fill(page, '#f-life-max', ''); await fill(page, '#f-alloc-lo', '0ms'); await fill(page, '#f-alloc-hi', '2ms'); await page.select('#f-live', '');
      await until(page, '--allocated-between 0us:2ms');
      assert.match(await text(page, '#filter-totals'), /2 of 170 blocks, 8\.00 KiB \(8 samples\)/);
      const low = await all(page, '#sites tbody tr', "[e.cells[0].innerText, e.cells[1].classList.contains('low'), e.cells[2].innerText]");
      assert.deepEqual(low, [['app::load_config (src/config.rs:30)', true, '3.45 KiB – 15.8 KiB']]);
      assert.match(await text(page, '#sites'), /fewer than 10 samples/);
      const [site] = JSON.parse((await hotspots(page, trace, '--json')).join('\n')).sites;
      assert.equal(site.estimate.samples, 8);
      const [lo8, hi8] = low[0][2].split(' – ');
      assert.ok(showsBytes(lo8, site.estimate.low) && showsBytes(hi8, site.estimate.high), `${low[0][2]} vs ${JSON.stringify(site.estimate)}`);
      await allocatedAnyTime(page);

      // Function clauses, several substrings each: inside run and cache is the cache; not
      // inside cache or init is the index. The command line agrees.
      n = await updates(page); await fill(page, '#f-inside', 'app::run; cache'); await settled(page, n);
      assert.match(await text(page, '#filter-totals'), /20 of 170 blocks, 160 KiB/);
      cli = await hotspots(page, trace);
      assert.match(cli[0], /--inside 'app::run' --inside 'cache' \(estimated\): total 160\.0 KiB\b.* in 160 samples, 20 sampled allocations$/, cli[0]);
      await fill(page, '#f-inside', ''); await fill(page, '#f-not-inside', 'cache;init'); await until(page, "--not-inside 'cache' --not-inside 'init'");
      assert.match(await text(page, '#filter-totals'), /50 of 170 blocks, 500 KiB/);
      assert.match((await hotspots(page, trace))[0], /total 500\.0 KiB\b.* in 500 samples, 50 sampled allocations$/);
      await allocatedAnyTime(page);

      // Hidden functions choose no block: they leave the stacks, and what they allocated
      // counts for their nearest caller not hidden (past the index's Vec::push, allocator
      // machinery: app::run). The command line's sites agree.
      await fill(page, '#f-inside', 'app::run'); await fill(page, '#f-hide', 'build_index');
      await until(page, "--inside 'app::run' --hide 'build_index'");
      assert.match(await text(page, '#filter-totals'), /70 of 170 blocks, 660 KiB/);
      const hidden = (await cells(page, '#sites tbody tr')).map((r) => r.slice(0, 2));
      assert.deepEqual(hidden, [['app::run (src/app.rs:40)', '500 KiB'], ['app::cache::insert (src/cache.rs:60)', '160 KiB']]);
      assert.ok(!(await all(page, '#flamegraph-svg g title', 'e.textContent')).some((t) => t.includes('build_index')));
      cli = await hotspots(page, trace);
      assert.match(cli[0], /total 660\.0 KiB\b.* in 660 samples, 70 sampled allocations$/, cli[0]);
      const cliSites = cli.filter((l) => l.endsWith(')')).map((l) => { const [, bytes, site] = /^\s*(\S+ \S+) .*  (\S.*)$/.exec(l); return [site, bytes]; });
      assert.deepEqual(cliSites, [['app::run (src/app.rs:40)', '500.0 KiB'], ['app::cache::insert (src/cache.rs:60)', '160.0 KiB']]);
      // A stack whose every frame is hidden has no site; one left with allocator frames only
      // keeps them (as on the command line: tests/integration/report_browser.rs).
      await fill(page, '#f-inside', ''); await fill(page, '#f-hide', 'app::; main');
      await until(page, "--hide 'app::' --hide 'main'");
      assert.deepEqual((await cells(page, '#sites tbody tr')).map((r) => r.slice(0, 2)), [['(no backtrace)', '560 KiB'], ['__rust_alloc', '500 KiB']]);
      await allocatedAnyTime(page);

      // Never freed, one click away: the cache, 160 KiB.
      n = await updates(page); await click(page, '#lt-never'); await settled(page, n);
      assert.match(await text(page, '#filter-totals'), /20 of 170 blocks, 160 KiB/);
      n = await updates(page); await click(page, '#lt-never'); // idempotent, no error
      await click(page, '#lt-clear'); await settled(page, n);

      // Keyboard: Tab leads from the filter bar to the chart, and from the flame graph's
      // toolbar into it; the flame graph zooms with Enter, Ctrl-F is left to the browser.
      const focused = () => page.evaluate(() => document.activeElement.id);
      await page.focus('#f-reset'); await page.keyboard.press('Tab'); assert.equal(await focused(), 'timeline');
      await page.focus('#fg-reset'); await page.keyboard.press('Tab'); assert.equal(await focused(), 'flamegraph');
      await page.focus('#flamegraph'); await page.keyboard.press('ArrowUp'); await page.keyboard.press('Enter');
      assert.notEqual(await attr(page, '#flamegraph-svg', 'data-root'), '0');
      await page.keyboard.press('Escape');
      const prevented = await page.evaluate(() => { const e = new KeyboardEvent('keydown', { key: 'f', ctrlKey: true, bubbles: true, cancelable: true }); document.body.dispatchEvent(e); return e.defaultPrevented; });
      assert.equal(prevented, false);
      // The chart's keys: End sets 'live at' the end of the trace, where the cache (never
      // freed) is live and the index (freed at 600 ms) is not.
      n = await updates(page); await page.focus('#timeline'); await page.keyboard.press('End'); await settled(page, n);
      assert.equal(await value(page, '#f-live'), 'time'); assert.equal(await value(page, '#f-live-at'), '600ms');
      assert.match(await text(page, '#filter-totals'), /20 of 170 blocks, 160 KiB/);
      // Flame graph height bounded.
      assert.ok((await (await page.$('#flamegraph')).boundingBox()).height <= 450);

      // Screenshots at 1400 and 760 px; readable and no horizontal scrolling at 760.
      await page.select('#f-live', 'peak');
      await shot(page, 'report-1400');
      await narrow(page, 'report-760');
      assert.deepEqual(errors, []);
    } finally { await page.close(); }
  });

  // Beyond --limit the samples are thinned, and the page says so.
  test('thinned report', async () => {
    const { page, errors } = await open(browser, env('THIN_HTML') + '#live=');
    try {
      assert.ok(await page.evaluate(() => document.getElementById('thinned').checkVisibility()));
      assert.match(await text(page, '#thinned'), /its 170 sampled blocks exceed the limit of 50 \(memtrace report --limit\), so each of their 1,060 samples was kept with probability 0\.0\d+/);
      const blocks = +(await text(page, '#filter-totals')).match(/^(\d+) of \1 blocks/)[1];
      assert.ok(blocks <= 50 && blocks > 20, `${blocks} blocks kept`);
      // The peak is that of every sample.
      assert.match(await text(page, '#peak-label'), /peak 660 KiB at 319ms/);
      assert.deepEqual(errors, []);
    } finally { await page.close(); }
  });

  // Start-up frames are trimmed from the outer end, but a stack made only of them keeps
  // them, on the page as on the command line.
  test('start-up frames', async () => {
    const { page, errors } = await open(browser, env('STARTUP_HTML'));
    try {
      const rows = (await cells(page, '#sites tbody tr')).map((r) => [r[0], r[4]]);
      assert.deepEqual(rows, [['app::parse (src/app.rs:40)', '50'], ['app::run (src/app.rs:20)', '5'], ['std::rt::lang_start_internal (library/std/src/rt.rs:1)', '3']]);
      // The live curve reaches the peak it labels, though the peak lasts a microsecond, far
      // less than the chart's step.
      assert.equal(+(await attr(page, '#timeline-svg', 'data-peak-bytes')), 58 * 800);
      assert.equal(+(await attr(page, '#timeline-svg', 'data-live-max')), 58 * 800);
      const cli = execFileSync(env('MEMTRACE_BIN'), ['hotspots', env('STARTUP_TRACE')]).toString().split('\n').slice(2).filter((l) => /^ +\d/.test(l));
      assert.deepEqual(cli.map((l) => { const [, samples, site] = /^ *\S+ \S+ +\S+ +\S+ +(\d+) +\S+ +(.*)$/.exec(l); return [site, samples]; }), rows);
      // Threads merged (the default): no thread frame; split by thread, the thread's.
      const libc = 'libc.so.6+0x2724a (/lib/x86_64-linux-gnu/libc.so.6:1)';
      const frames = ['all', 'app::parse (src/app.rs:40)', 'app::run (src/app.rs:20)', 'std::rt::lang_start_internal (library/std/src/rt.rs:1)', '_start', 'main', libc];
      assert.equal(await value(page, '#fg-root'), 'span');
      assert.deepEqual((await flameLabels(page)).sort(), frames.slice().sort());
      let n = await updates(page); await page.select('#fg-root', 'thread'); await settled(page, n);
      assert.deepEqual((await flameLabels(page)).sort(), frames.concat(['thread main']).sort());
      // The frames from a node out to the thread's, as the flame graph draws them.
      const outward = async (label) => page.evaluate((label) => {
        const title = (g) => g.querySelector('title').textContent.split(' — ')[0];
        const gs = [...document.querySelectorAll('#flamegraph-svg g')], byNode = new Map(gs.map((g) => [g.dataset.node, g]));
        const out = []; for (let g = gs.find((g) => title(g) === label); g && g.dataset.node !== '0'; g = byNode.get(g.dataset.parent)) out.push(title(g));
        return out;
      }, label);
      // Trimmed: the outermost frame under the thread is the program's own.
      assert.deepEqual(await outward('app::run (src/app.rs:20)'), ['app::run (src/app.rs:20)', 'thread main']);
      // Unticked, the start-up frames are back, in their order.
      n = await updates(page); await click(page, '#f-trim-root'); await settled(page, n);
      assert.deepEqual(await outward('app::run (src/app.rs:20)'), ['app::run (src/app.rs:20)', 'main', libc, '_start', 'thread main']);
      assert.deepEqual(errors, []);
    } finally { await page.close(); }
  });

  // The tokio example's trace: its main thread hands `main`'s async body to the runtime, whose
  // `block_on` tower is trimmed with the start-up frames: under the thread, the body.
  test('tokio runtime start-up trimmed', async () => {
    const { page, errors } = await open(browser, env('TOKIO_HTML') + '#live=&fg-root=thread');
    try {
      const towers = async () => page.evaluate(() => {
        const title = (g) => g.querySelector('title').textContent.split(' — ')[0];
        const gs = [...document.querySelectorAll('#flamegraph-svg g')], main = gs.find((g) => title(g) === 'thread main');
        const under = main ? gs.filter((g) => g.dataset.parent === main.dataset.node).map(title) : [];
        return { under, all: gs.map(title) };
      });
      const trimmed = await towers();
      assert.ok(trimmed.under.length > 0, 'the main thread allocated');
      // Under the thread: `main`'s body, and `main` where it allocates itself (the runtime's
      // building), never the tower between them.
      assert.ok(trimmed.under.some((f) => f.startsWith('tokio_spans::main::{')), `under thread main: ${trimmed.under}`);
      for (const f of trimmed.under) assert.match(f, /^tokio_spans::main(::\{| \()/, `under thread main: ${trimmed.under}`);
      assert.deepEqual(trimmed.all.filter((f) => /block_on|lang_start/.test(f)), []);
      // The tower is there to trim: with the start-up frames kept, block_on is drawn.
      const n = await updates(page); await click(page, '#f-trim-root'); await settled(page, n);
      assert.ok((await towers()).all.some((f) => f.startsWith('tokio::runtime::runtime::Runtime::block_on')));
      await click(page, '#f-trim-root');
      await shot(page, 'tokio-1400');
      assert.deepEqual(errors, []);
    } finally { await page.close(); }
  });

  // B has 20 more cache blocks than A: +160 KiB.
  test('diff report', async () => {
    const { page, errors } = await open(browser, env('DIFF_HTML'));
    try {
      assert.equal(+(await attr(page, '#flamegraph-svg', 'data-total')), 160 * KiB);
      const rows = await cells(page, '#sites tbody tr');
      assert.deepEqual(rows[0].slice(0, 4), ['app::cache::insert (src/cache.rs:60)', '160 KiB', '320 KiB', '160 KiB']);
      // Per-site live heap: each site's A (dashed) and B (solid) curve, not stacked, the site
      // that changed first: the cache, 160 KiB live in A, 320 KiB in B; the index, the same
      // 500 KiB in both. Its legend button leaves only its two curves.
      const curves = () => all(page, '#site-timeline path[data-site]', "[e.dataset.site, e.dataset.trace, +e.dataset.max, e.getAttribute('stroke-dasharray')]");
      const cache = 'app::cache::insert (src/cache.rs:60)', index = 'app::build_index (src/index.rs:50)';
      let drawn = await curves();
      assert.deepEqual(drawn.slice(0, 2), [[cache, 'A', 160 * KiB, '5 3'], [cache, 'B', 320 * KiB, '']]);
      assert.deepEqual(drawn.filter((c) => c[0] === index).map((c) => c.slice(1, 3)), [['A', 500 * KiB], ['B', 500 * KiB]]);
      assert.match(await text(page, '#site-legend button:first-child'), /app::cache::insert \(src\/cache\.rs:60\)\s*A 160 KiB, B 320 KiB/);
      await click(page, '#site-legend button:first-child');
      assert.deepEqual((await curves()).map((c) => c.slice(0, 3)), [[cache, 'A', 160 * KiB], [cache, 'B', 320 * KiB]]);
      await click(page, '#site-legend button:first-child');
      await shot(page, 'diff-1400');
      await narrow(page, 'diff-760'); await page.setViewport({ width: 1400, height: 1000 });
      let n = await updates(page); await page.select('#f-live', 'end'); await settled(page, n);
      assert.equal(+(await attr(page, '#flamegraph-svg', 'data-total')), 160 * KiB);
      assert.deepEqual((await curves()).map((c) => c.slice(0, 3)), [[cache, 'A', 160 * KiB], [cache, 'B', 320 * KiB]]);
      assert.deepEqual(errors, []);
    } finally { await page.close(); }
  });

  // A trace whose thread, span, function and file names and metadata hold terminal escapes,
  // bidi overrides, invalid UTF-8 and markup (tests/integration/cli_inert.rs): no markup
  // runs, and the page shows every such character as its escape (`\u{202e}`), never raw.
  test('hostile names', async () => {
    // Everything allocated, split by thread: every name the trace holds is shown.
    const { page, errors } = await open(browser, env('HOSTILE_HTML') + '#live=&fg-root=thread');
    try {
      assert.equal(await count(page, 'img, iframe, object, embed'), 0);
      assert.equal(await count(page, 'script'), 2);
      // The text of the page but its scripts' (the data is JSON there), SVG titles included.
      const shown = await page.evaluate(() => { const b = document.body.cloneNode(true); b.querySelectorAll('script').forEach((e) => e.remove()); return b.textContent; });
      const raw = shown.match(/[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufffd]/u);
      assert.equal(raw, null, `shown raw: U+${raw?.[0].codePointAt(0).toString(16)}`);
      for (const escaped of ['thread worker\\x1b]0;PWNED\\x07\\x1b[2J\\x0d\\u{200f}', 'app::handle\\x1b[2J\\xff\\xfe\\u{2066} (src/\\u{202e}sr.evil:7)',
        'span request{user=</script><img src=x onerror=alert(1)>\\x1b[31m\\u{202e}txt.exe\\x07}', '/usr/bin/app\\x1b]0;PWNED\\x07\\xff', '</script><img src=x onerror=alert(1)>']) {
        assert.ok(shown.includes(escaped), `the page does not show ${escaped}`);
      }
      assert.deepEqual(errors, []);
    } finally { await page.close(); }
  });

  test('big report timing', { skip: !process.env.BIG_REPORT }, async () => {
    const t0 = Date.now();
    const { page, errors } = await open(browser, process.env.BIG_REPORT);
    try {
      const wall = Date.now() - t0;
      const ready = await page.evaluate(() => window.__memtraceReady);
      const timings = [];
      for (const [sel, v] of [['#f-live', 'peak'], ['#f-live', 'end'], ['#f-live', '']]) {
        const n = await updates(page); await page.select(sel, v); await settled(page, n);
        await page.waitForFunction(() => window.__memtraceTiming.painted_ms > 0); timings.push(await page.evaluate(() => window.__memtraceTiming));
      }
      let n = await updates(page); await fill(page, '#f-life-max', '500us'); await settled(page, n); await page.waitForFunction(() => window.__memtraceTiming.painted_ms > 0); timings.push(await page.evaluate(() => window.__memtraceTiming));
      n = await updates(page); await fill(page, '#f-inside', 'stack3'); await settled(page, n); await page.waitForFunction(() => window.__memtraceTiming.painted_ms > 0); timings.push(await page.evaluate(() => window.__memtraceTiming));
      console.log(JSON.stringify({ wall_open_ms: wall, ready, timings }, null, 1));
      await shot(page, 'big-1400', false);
      assert.deepEqual(errors, []);
    } finally { await page.close(); }
  });
});
