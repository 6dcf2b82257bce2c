// The page: one WebSocket to the bridge (`suturesim view`, same host and port, path /ws), whose JSON frames feed
// the 3D scene, the force plot and the side panel (with a suture section in scenes with tissue and a needle, and
// a tools section once a stylus has sent a pose). The frame format is in tools/view.py's docstring.
//
// The view: the orbit view by default; `?view=operator&device=NAME` (or the view menu) puts the camera where that
// device's operator sits (`?view=operator` alone: the first tool's). The menu keeps the URL in step.

import { ForcePlot } from './plot.js';
import { Scene, needlePoints } from './scene.js';
import { toolRow, tools } from './tools.js';
import { deviceColor, fmt, fmtAge, fmtLength, isNum } from './util.js';

const STALE_S = 2;          // no message for this long: the publisher is gone (a server sends stats at 1 Hz)
const MAX_EVENTS = 12;      // events listed, newest first

const $ = id => document.getElementById(id);
const scene = new Scene($('scene'), deviceColor);
const plot = new ForcePlot($('plot'), deviceColor);
const link = { open: false, endpoint: null, age: null, at: 0, retryMs: 250 };
let prevStats = null;       // the last stats item ({recv, stats}), for the tick rate
const events = [];
const HINTS = { orbit: 'drag: orbit · wheel: zoom · double-click: fit',
  operator: 'operator view · wheel: zoom · double-click: reset zoom' };

// The view asked for: the URL's at first, then the menu's. A device not seen yet still gets its menu item.
const query = new URLSearchParams(location.search);
const view = { mode: query.get('view') === 'operator' ? 'operator' : 'orbit', device: query.get('device') || null };
const viewDevices = new Set(view.device ? [view.device] : []);

function setView(mode, device) {
  view.mode = mode;
  view.device = mode === 'operator' ? device : null;
  scene.setView(view);
  $('hint').textContent = HINTS[view.mode];
  const url = new URL(location.href);
  url.searchParams.delete('device');
  if (view.mode === 'operator') {
    url.searchParams.set('view', 'operator');
    if (view.device) url.searchParams.set('device', view.device);
  } else {
    url.searchParams.delete('view');
  }
  if (url.href !== location.href) history.replaceState(null, '', url);
  showViewMenu();
}

function showViewMenu() {
  const menu = $('view'), want = view.mode === 'operator' ? `operator:${view.device || ''}` : 'orbit';
  const items = [['orbit', 'orbit'], ...[...viewDevices].map(d => [`operator:${d}`, `operator: ${d}`])];
  if (want === 'operator:') items.push([want, 'operator: first tool']);
  if (menu.options.length !== items.length || items.some(([v], i) => menu.options[i].value !== v)) {
    menu.replaceChildren(...items.map(([value, label]) => new Option(label, value)));
  }
  menu.value = want;
}

$('view').addEventListener('change', e => {
  const v = e.target.value;
  if (v.startsWith('operator:')) setView('operator', v.slice('operator:'.length) || null);
  else setView('orbit', null);
});

function connect() {
  const ws = new WebSocket(`${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}/ws`);
  ws.onopen = () => { link.open = true; link.retryMs = 250; };
  ws.onmessage = ev => onMessage(JSON.parse(ev.data));
  ws.onclose = () => {
    link.open = false;
    link.age = null;
    setTimeout(connect, link.retryMs);
    link.retryMs = Math.min(2 * link.retryMs, 4000);
  };
}

function onMessage(m) {
  if (m.type === 'hello') { link.endpoint = m.endpoint; return; }
  if (m.type !== 'frame') return;
  link.endpoint = m.endpoint;
  link.age = m.age;
  link.at = performance.now();
  for (const e of m.events || []) onEvent(e);    // before the state: a reset refits to the state after it
  if (m.state) { scene.setState(m.state); showThread(m.state); showTools(m.state); }
  for (const [dev, pts] of Object.entries(m.force || {})) plot.add(dev, pts);
  for (const s of m.stats || []) showStats(s);
  if (m.score) showScore(m.score);
}

// The attempt's score as the bridge computes it (tools/view.py score_to_json): the FLS-style score and the
// benchmarks passed, each phase's time, each mark's offset, the knot and the penalties. Suture scenes only.
function showScore(sc) {
  const shown = sc.tissue === true;
  $('score-head').hidden = $('score').hidden = !shown;
  if (!shown) return;
  const checks = Array.isArray(sc.checks) ? sc.checks : [];
  const passed = checks.filter(c => c[1] === true).length;
  const rows = [
    ['score', sc.done ? `${fmt(sc.score, 4)} (${sc.passed ? 'pass' : 'fail'})` : `not done (${fmt(sc.elapsed_s, 4)} s)`],
    ['benchmarks passed', `${passed} / ${checks.length}`],
    ...(sc.phases || []).map(([name, t]) => [String(name), `${fmt(t, 4)} s`]),
    ...(sc.marks || []).map(([id, mm]) => [`${id} mark off by`, `${fmt(mm, 3)} mm`]),
    ['knot', typeof sc.knot === 'string' ? `${sc.knot}${sc.square ? ' (square)' : ''}` : '–'],
    ['penalties', `${fmt(sc.penalties, 4)} points`],
  ];
  setRows($('score'), rows);
}

function onEvent(e) {
  if (e.kind === 'reset' || e.kind === 'load') { scene.refit(); plot.clear(); }
  const details = Object.entries(e).filter(([k]) => !['v', 'seq', 't', 'kind'].includes(k))
    .map(([k, v]) => `${k}=${typeof v === 'object' ? JSON.stringify(v) : v}`).join(' ');
  events.unshift([isNum(e.t) ? e.t.toFixed(3) : '–', `${e.kind} ${details}`]);
  events.length = Math.min(events.length, MAX_EVENTS);
  $('events').replaceChildren(...events.map(([t, text]) => {
    const li = document.createElement('li');
    const span = document.createElement('span');
    span.className = 't';
    span.textContent = t;
    li.append(span, text);      // text nodes: payload strings are never parsed as HTML
    return li;
  }));
}

function setRows(table, rows) {
  table.replaceChildren(...rows.map(([label, value]) => {
    const tr = document.createElement('tr');
    for (const text of [label, value]) tr.appendChild(document.createElement('td')).textContent = text;
    return tr;
  }));
}

const us = q => (q && isNum(q.p50) ? `${fmt(q.p50)} / ${fmt(q.p99)} / ${fmt(q.max)}` : '–');

function showStats(item) {
  const s = item.stats;
  // ticks per second of the bridge's clock between two stats; the median period for the first one
  let rate = s.period_us && isNum(s.period_us.p50) && s.period_us.p50 > 0 ? 1e6 / s.period_us.p50 : NaN;
  if (prevStats && isNum(s.ticks) && s.ticks >= prevStats.stats.ticks && item.recv > prevStats.recv) {
    rate = (s.ticks - prevStats.stats.ticks) / (item.recv - prevStats.recv);
  }
  prevStats = item;
  const sub = s.substeps || {};
  const cpu = isNum(s.cpu) && s.cpu >= 0 ? `, cpu ${s.cpu}` : '';
  setRows($('loop'), [
    ['rate', `${fmt(rate, 4)} Hz`],
    ['lateness p50/p99/max', `${us(s.lateness_us)} µs`],
    ['step p50/p99/max', `${us(s.step_us)} µs`],
    ['tick p50/p99/max', `${us(s.tick_us)} µs`],
    ['period p50/p99/max', `${us(s.period_us)} µs`],
    ['overruns', fmt(s.overruns, 9)],
    ['ticks', fmt(s.ticks, 12)],
    ['substeps mean/max', `${fmt(sub.mean)} / ${fmt(sub.max)}`],
    ['real-time', s.realtime === undefined ? '–' : `${s.realtime ? 'yes' : 'no'}${cpu}`],
  ]);
}

// A grasp as the panel lists it: device@vertex (@vertex + frac along a segment), "(needle)" on the needle.
const grasped = g => `${g.device}@${isNum(g.frac) && g.frac > 0 ? (g.vertex + g.frac).toFixed(2) : g.vertex}` +
  (g.holds === 'needle' ? ' (needle)' : '');

function showThread(s) {
  let tmax = NaN;
  for (const v of s.tension) if (isNum(v) && !(Math.abs(v) <= Math.abs(tmax))) tmax = v;
  const e = s.energy || {}, sol = s.solver || {};
  setRows($('thread'), [
    ['t', `${fmt(s.t, 6)} s`],
    ['seq', String(s.seq)],
    ['vertices', String(s.n)],
    ['largest |tension|', `${fmt(tmax)} N`],
    ['contacts', String(s.contacts)],
    ['grasps', s.grasps.map(grasped).join(', ') || 'none'],
    ['twist', `${fmt(s.twist)} rad`],
    ['kinetic energy', `${fmt(e.kinetic)} J`],
    ['elastic energy', `${fmt(e.elastic)} J`],
    ['gravitational energy', `${fmt(e.gravity)} J`],
    ['solver iters/substeps', `${fmt(sol.iters)} / ${fmt(sol.substeps)}`],
    ['solver residual', fmt(sol.residual)],
  ]);
  showSuture(s.tissue, s.needle);
}

// Scenes with tissue and a needle: the wound's gap and throws, the punctures by what goes through them, and the
// torque the needle puts on its hand. The section stays hidden in scenes without them.
function showSuture(tissue, needle) {
  const rows = [];
  if (tissue) {
    const count = on => (tissue.punctures || []).filter(q => q.on === on).length;
    rows.push(['gap', isNum(tissue.gap) ? `${(tissue.gap * 1000).toFixed(2)} mm` : '–'],
      ['knot', typeof tissue.knot === 'string' ? tissue.knot : '–'],
      ['throws', `${isNum(tissue.throws) ? tissue.throws : '–'} (linking ${fmt(tissue.linking)})`],
      ['pads', (tissue.pads || []).map(p => p.id).join(', ') || 'none'],
      ['punctures needle/thread/passed', `${count('needle')} / ${count('thread')} / ${count('passed')}`]);
  }
  if (needle) {
    const tq = Array.isArray(needle.torque) && needle.torque.every(isNum) ? Math.hypot(...needle.torque) : NaN;
    const scaled = (v, k) => (isNum(v) ? fmt(v * k) : '–');
    rows.push(['needle radius/arc', `${scaled(needle.radius, 1000)} mm / ${scaled(needle.arc, 180 / Math.PI)}°`],
      ['needle torque', `${fmt(tq)} N m`]);
  }
  const shown = rows.length > 0;
  $('suture-head').hidden = !shown;
  $('suture').hidden = !shown;
  if (shown) setRows($('suture'), rows);
}

// Each tool: its device, what its jaw holds and its clutch; its jaw's height over the tissue and its distance to
// the needle. New devices join the view menu; `?view=operator` without a device takes the first tool's.
function showTools(s) {
  const list = tools(s);
  let added = false;
  for (const t of list) if (!viewDevices.has(t.device)) { viewDevices.add(t.device); added = true; }
  if (view.mode === 'operator' && !view.device && list.length) setView('operator', list[0].device);
  else if (added) showViewMenu();
  const needle = needlePoints(s.needle);
  const table = $('tools');
  table.replaceChildren(...list.flatMap(tool => {
    const [device, held, height, toNeedle] = toolRow(s, tool, needle);
    const head = document.createElement('tr');
    const name = head.appendChild(document.createElement('td'));
    name.textContent = device;      // text nodes: payload strings are never parsed as HTML
    name.style.color = deviceColor(device);
    head.appendChild(document.createElement('td')).textContent = held;
    const cue = document.createElement('tr');
    cue.appendChild(document.createElement('td')).textContent = needle ? 'height / to needle' : 'height';
    const len = v => (isNum(v) ? (v < 0 ? `−${fmtLength(-v)}` : fmtLength(v)) : '–');
    cue.appendChild(document.createElement('td')).textContent =
      needle ? `${len(height)} / ${len(toNeedle)}` : len(height);
    return [head, cue];
  }));
  $('tools-head').hidden = table.hidden = list.length === 0;
}

// The status line: the bridge link, then the publisher's liveness (the bridge's message age plus our frame's).
function showStatus() {
  const ep = link.endpoint || 'the publisher';
  let state, text;
  if (!link.open) {
    state = 'disconnected';
    text = 'disconnected from the viewer bridge (is `suturesim view` running?); retrying';
  } else if (link.age === null) {
    state = 'waiting';
    text = `waiting: no messages yet from ${ep} (is the server running?)`;
  } else {
    const age = link.age + (performance.now() - link.at) / 1000;
    state = age > STALE_S ? 'stale' : 'connected';
    text = age > STALE_S ? `disconnected: no messages from ${ep} for ${fmtAge(age)}`
      : `connected to ${ep} · last message ${fmtAge(age)} ago`;
  }
  const el = $('status');
  if (el.textContent !== text) el.textContent = text;
  el.dataset.state = state;
}

function frame() {
  if (scene.dirty) scene.draw();
  if (plot.dirty) plot.draw();
  requestAnimationFrame(frame);
}

new ResizeObserver(() => { scene.dirty = true; plot.dirty = true; }).observe(document.body);
setView(view.mode, view.device);
setInterval(showStatus, 250);
connect();
requestAnimationFrame(frame);
