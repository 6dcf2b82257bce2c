// The tools of state.tools: each stylus's jaw (two prongs, open or closed) and shaft along the tool's axis, as
// long as its body in the scene (`body`: the jaw's and the shaft's lengths, a short stub for a hand), coloured by
// what the jaw holds, dashed while its clutch is held; under each jaw its depth cues, a shadow
// on the tissue's top (z = 0 without tissue) and a drop line to it; the entry and exit marks of
// state.tissue.targets; and the operator's view of a device, built from its tool's frame, centre and scale.
//
// The tool's axis is its body z turned by `quat` (OpenHaptics' stylus axis: the shaft runs from the jaw along +z,
// back toward the hand); the prongs open along its body x.

import { add, isVec, padBox, polylineDistance, rotate, unitQuat } from './geom.js';
import { drawDot, fmt, fmtLength, isNum } from './util.js';

// the jaw's colour by what it holds: needle and thread as their punctures, tissue (forceps on a pad) pink
export const JAW = { open: '#f8fafc', needle: '#e879f9', thread: '#4ade80', tissue: '#fda4af' };
export const TARGET = { entry: '#2dd4bf', exit: '#fb923c' };
const SHAFT_M = 0.02;           // the shaft drawn behind the jaw of a tool without a body (a hand) (m)
const HINGE_M = 0.006;          // its prongs' length, jaw to hinge (m)
const JAW_OPEN_M = 0.0025;      // each prong's tip off the axis when open (m)
const SHADOW_M = 0.0015;        // the shadow's radius (m)
const TARGET_M = 0.002;         // a mark's radius (m)
export const OPERATOR_DIST_M = 0.25;   // the operator's eye from the workspace centre at motion scale 1 (m)

export const jawState = tool => (tool.holds in JAW && tool.holds !== 'open' ? tool.holds : 'open');

export const tools = state => (Array.isArray(state.tools) ? state.tools.filter(t => t && isVec(t.pos)) : []);

export const toolOf = (state, device) => tools(state).find(t => t.device === device) || null;

// The z of the tissue's top under p: the top of the pad whose footprint holds p's (x, y), else of the pad
// nearest to it in x and y, else 0 (the ground plane of a scene without tissue).
export function surfaceZ(p, state) {
  const boxes = state.tissue && Array.isArray(state.tissue.pads) ? state.tissue.pads.map(padBox).filter(b => b) : [];
  let best = null, bestD = Infinity;
  for (const { lo, hi } of boxes) {
    const dx = Math.max(lo[0] - p[0], 0, p[0] - hi[0]), dy = Math.max(lo[1] - p[1], 0, p[1] - hi[1]);
    const d = Math.hypot(dx, dy);
    if (d < bestD || (d === bestD && hi[2] > best)) { best = hi[2]; bestD = d; }
  }
  return best === null ? 0 : best;
}

// Where the operator of a tool's device sits: looking along the device's -z toward its workspace centre, its +y
// up, both turned into the scene by `frame`, OPERATOR_DIST_M x the motion scale away. Identity frame, the jaw as
// centre and scale 1 stand in for what a publisher left out.
export function operatorPose(tool) {
  const f = unitQuat(tool.frame) || [1, 0, 0, 0];
  const scale = isNum(tool.scale) && tool.scale > 0 ? tool.scale : 1;
  return { centre: isVec(tool.centre) ? tool.centre : tool.pos, back: rotate(f, [0, 0, 1]), up: rotate(f, [0, 1, 0]),
    dist: OPERATOR_DIST_M * scale };
}

// A circle of radius r about c in the horizontal plane, as 3D points.
const ring = (c, r, n = 20) => Array.from({ length: n + 1 },
  (_, k) => [c[0] + r * Math.cos(2 * Math.PI * k / n), c[1] + r * Math.sin(2 * Math.PI * k / n), c[2]]);

function path(scene, cam, pts) {
  const scr = pts.map(p => scene.project(cam, p));
  if (!scr.every(p => p)) return false;
  const ctx = scene.ctx;
  ctx.beginPath();
  scr.forEach((p, i) => (i ? ctx.lineTo(p[0], p[1]) : ctx.moveTo(p[0], p[1])));
  return true;
}

// Each target: a ring on its pad's top, an exit crossed through; labelled with its id and kind, an entry's to its
// left and an exit's to its right (a bite's marks face each other across the wound).
export function drawTargets(scene, cam) {
  const ctx = scene.ctx, t = scene.state.tissue;
  if (!t || !Array.isArray(t.targets)) return;
  for (const tg of t.targets) {
    if (!isVec(tg.pos)) continue;
    const color = TARGET[tg.kind] || '#e5e7eb';
    ctx.strokeStyle = color;
    ctx.lineWidth = 2;
    if (path(scene, cam, ring(tg.pos, TARGET_M))) ctx.stroke();
    if (tg.kind === 'exit') {
      const d = TARGET_M * Math.SQRT1_2;
      scene.line(cam, add(tg.pos, [-d, -d, 0]), add(tg.pos, [d, d, 0]));
      scene.line(cam, add(tg.pos, [-d, d, 0]), add(tg.pos, [d, -d, 0]));
    }
    const left = tg.kind === 'entry', p = scene.project(cam, add(tg.pos, [left ? -TARGET_M : TARGET_M, 0, 0]));
    if (!p) continue;
    const label = tg.id && tg.kind && tg.id !== tg.kind ? `${tg.id} (${tg.kind})` : tg.id || tg.kind || 'target';
    ctx.fillStyle = color;
    ctx.textAlign = left ? 'right' : 'left';
    ctx.fillText(label, p[0] + (left ? -4 : 4), p[1] + 12);
    ctx.textAlign = 'left';
  }
}

// Every tool's depth cue: its shadow and drop line, with the jaw's height over the tissue (drawn before the marks
// and the tools, which it must not hide).
export function drawDepthCues(scene, cam) {
  for (const tool of tools(scene.state)) drawDepthCue(scene, cam, tool);
}

// Every tool; returns the devices labelled here (the grasp rings leave their label out).
export function drawTools(scene, cam) {
  const list = tools(scene.state);
  const forces = new Map(scene.state.grasps.map(g => [g.device, g.force]));
  for (const tool of list) drawTool(scene, cam, tool, forces.get(tool.device));
  return new Set(list.map(t => t.device));
}

function drawDepthCue(scene, cam, tool) {
  const ctx = scene.ctx, color = scene.deviceColor(tool.device);
  const ground = [tool.pos[0], tool.pos[1], surfaceZ(tool.pos, scene.state)];
  ctx.setLineDash([3, 3]);
  ctx.strokeStyle = color;
  ctx.lineWidth = 1;
  scene.line(cam, tool.pos, ground);
  ctx.setLineDash([]);
  if (path(scene, cam, ring(ground, SHADOW_M, 16))) {
    ctx.fillStyle = 'rgba(0,0,0,0.6)';
    ctx.fill();
    ctx.lineWidth = 1.5;
    ctx.stroke();
  }
  const p = scene.project(cam, add(tool.pos, ground, 1).map(v => v / 2));
  if (p) {                        // the height, left of the drop line's middle (the tool's label is up right)
    const h = tool.pos[2] - ground[2];
    ctx.fillStyle = '#8a909c';
    ctx.textAlign = 'right';
    ctx.fillText(`${h < 0 ? '−' : ''}${fmtLength(Math.abs(h))}`, p[0] - 6, p[1] + 4);
    ctx.textAlign = 'left';
  }
}

// One tool: the shaft in its device's colour, the prongs and a dot at the jaw in the colour of what it holds
// (hollow and dashed while clutched), and a label: device, what it holds, clutch, the grasp's force.
function drawTool(scene, cam, tool, force) {
  const ctx = scene.ctx, q = unitQuat(tool.quat) || [1, 0, 0, 0], state = jawState(tool);
  const axis = rotate(q, [0, 0, 1]), side = rotate(q, [1, 0, 0]);
  const jawColor = JAW[state], color = scene.deviceColor(tool.device);
  // body: [jaw length, jaw radius, shaft length, shaft radius] (m), what the thread meets
  const body = isVec(tool.body, 4) ? tool.body : null;
  const hinge = add(tool.pos, axis, body ? body[0] : HINGE_M), open = state === 'open' ? JAW_OPEN_M : 0.0004;
  ctx.lineCap = 'round';
  ctx.setLineDash(tool.clutched ? [4, 3] : []);
  ctx.strokeStyle = color;
  ctx.lineWidth = body ? 4 : 3;
  scene.line(cam, hinge, add(tool.pos, axis, body ? body[0] + body[2] : SHAFT_M));
  ctx.strokeStyle = jawColor;
  ctx.lineWidth = 2.5;
  for (const s of [-1, 1]) scene.line(cam, hinge, add(tool.pos, side, s * open));
  ctx.setLineDash([]);
  const p = scene.project(cam, tool.pos);
  if (!p) return;
  drawDot(ctx, p, 4.5, jawColor, tool.clutched);
  let label = `${tool.device} · ${state}${tool.clutched ? ' · clutch' : ''}`;
  if (Array.isArray(force) && force.every(isNum)) label += ` · ${fmt(Math.hypot(...force))} N`;
  ctx.fillStyle = color;
  ctx.fillText(label, p[0] + 10, p[1] - 10);
}

// What the jaws' colours and the marks mean, on one line at y.
export function drawToolLegend(ctx, y) {
  let x = 12;
  const text = (s, color = '#d5d8de') => { ctx.fillStyle = color; ctx.fillText(s, x, y); x += ctx.measureText(s).width; };
  text('jaws:');
  x += 12;
  for (const [name, hollow] of [['open', false], ['needle', false], ['thread', false], ['tissue', false], ['clutch', true]]) {
    drawDot(ctx, [x, y - 4], 4, hollow ? JAW.open : JAW[name], hollow);
    x += 8;
    text(name);
    x += 14;
  }
  x += 10;
  text('marks:');
  for (const kind of ['entry', 'exit']) {
    x += 16;
    ctx.beginPath();
    ctx.arc(x, y - 4, 4, 0, 2 * Math.PI);
    ctx.strokeStyle = TARGET[kind];
    ctx.lineWidth = 2;
    ctx.stroke();
    if (kind === 'exit') {
      ctx.beginPath();
      ctx.moveTo(x - 3, y - 7); ctx.lineTo(x + 3, y - 1);
      ctx.moveTo(x - 3, y - 1); ctx.lineTo(x + 3, y - 7);
      ctx.stroke();
    }
    x += 8;
    text(kind, TARGET[kind]);
  }
}

// A tool as the side panel lists it: [device, what its jaw holds and its clutch, its height over the tissue
// and its distance to the needle (m, NaN without a needle)].
export function toolRow(state, tool, needle) {
  const held = `${jawState(tool)}${tool.clutched ? ' · clutch' : ''}`;
  const height = tool.pos[2] - surfaceZ(tool.pos, state);
  return [tool.device, held, height, needle ? polylineDistance(tool.pos, needle) : NaN];
}
