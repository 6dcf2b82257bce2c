// The thread in 3D on a 2D canvas: a perspective camera orbiting a target point. Scene frame as published:
// metres, right-handed, z up. Hand-written on purpose: a hundred segments need no WebGL, and a 2D canvas draws
// the same in every browser, headless ones included. In scenes with tissue and a needle (state.tissue,
// state.needle) it also draws the pads (translucent boxes), the punctures (dots) and the needle (a steel arc), with
// the entry and exit marks and each stylus's tool when the state has them (tools.js). The camera orbits the scene
// (the default) or sits where the operator of one device does (setView: the operator view).

import { clamp, clearCanvas, drawDot, fmt, fmtLength, isNum, niceCeil, niceFloor } from './util.js';
import { cross, dot, isVec, norm, padBox, rotate, sub } from './geom.js';
import { drawDepthCues, drawTargets, drawToolLegend, drawTools, operatorPose, toolOf, tools } from './tools.js';

const FOV = 40 * Math.PI / 180;     // vertical field of view
const Z_UP = [0, 0, 1];

// The needle: a circular arc of radius R swaged to thread vertex 0; in its body frame
// a(theta) = R (sin theta, 1 - cos theta, 0) for theta in [0, arc]. NEEDLE_SEGS segments; null if malformed.
const NEEDLE_SEGS = 24;
export function needlePoints(nd) {
  if (!nd || !isVec(nd.pos) || !isVec(nd.quat, 4) || !isNum(nd.radius) || !isNum(nd.arc)) return null;
  const l = Math.hypot(...nd.quat);
  if (!(l > 0)) return null;
  const q = nd.quat.map(v => v / l), R = nd.radius, pts = [];
  for (let k = 0; k <= NEEDLE_SEGS; k++) {
    const th = nd.arc * k / NEEDLE_SEGS;
    const a = rotate(q, [R * Math.sin(th), R * (1 - Math.cos(th)), 0]);
    pts.push([nd.pos[0] + a[0], nd.pos[1] + a[1], nd.pos[2] + a[2]]);
  }
  return pts;
}

// Does the sight line from the eye to p cross the box before reaching p (p inside or behind it)? A slab test.
function hidden(eye, p, box) {
  let t0 = 0, t1 = 1;
  for (let k = 0; k < 3; k++) {
    const d = p[k] - eye[k];
    if (Math.abs(d) < 1e-12) {
      if (eye[k] < box.lo[k] || eye[k] > box.hi[k]) return false;
      continue;
    }
    let a = (box.lo[k] - eye[k]) / d, b = (box.hi[k] - eye[k]) / d;
    if (a > b) [a, b] = [b, a];
    t0 = Math.max(t0, a);
    t1 = Math.min(t1, b);
    if (t0 > t1) return false;
  }
  return true;
}

// Tissue, needle and puncture colours. A puncture is coloured by what goes through it.
export const TISSUE = [226, 160, 142];
export const STEEL = '#cbd5e1';
export const PUNCTURE = { needle: '#e879f9', thread: '#4ade80', passed: '#94a3b8' };
const rgba = (c, a) => `rgba(${c[0]},${c[1]},${c[2]},${a})`;

// Tension colours: grey at zero, yellow then red when taut, blue when compressed; `range` (N) is full scale.
const GREY = [150, 156, 168], YELLOW = [250, 204, 21], RED = [239, 68, 68], BLUE = [56, 140, 248];
const mix = (a, b, f) => a.map((v, i) => Math.round(v + (b[i] - v) * f));
export function tensionColor(t, range) {
  if (!isNum(t)) return 'rgb(90,90,90)';
  const f = clamp(t / range, -1, 1);
  const c = f < 0 ? mix(GREY, BLUE, -f) : f < 0.5 ? mix(GREY, YELLOW, 2 * f) : mix(YELLOW, RED, 2 * f - 1);
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

// The colour scale's full range (N): it jumps up at once but decays over seconds, so colours do not flicker.
class TensionRange {
  constructor() { this.peak = 0; this.at = 0; this.value = 1e-3; }
  update(tension) {
    let m = 0;
    for (const v of tension) if (isNum(v)) m = Math.max(m, Math.abs(v));
    const now = performance.now() / 1000;
    this.peak = Math.max(m, this.peak * Math.exp(-(now - this.at) / 1.5));
    this.at = now;
    this.value = niceCeil(Math.max(this.peak, 1e-3));
  }
}

export class Scene {
  constructor(canvas, deviceColor) {
    this.canvas = canvas;
    this.ctx = canvas.getContext('2d');
    this.deviceColor = deviceColor;
    this.az = -Math.PI / 3;       // camera azimuth about z: a three-quarter view with +x to the right
    this.el = 0.45;               // camera elevation (rad)
    this.zoom = 1;                // multiplies the fitted distance (wheel)
    this.target = [0, 0, 0];      // orbit centre (m)
    this.radius = 0.1;            // fitted scene radius (m)
    this.ground = 0;              // z of the grid plane (m)
    this.viewpoint = { mode: 'orbit', device: null };   // or mode 'operator': the camera of that device's operator
    this.state = null;
    this.needsFit = true;
    this.dirty = true;
    this.range = new TensionRange();
    this.bindInput();
  }

  bindInput() {
    const c = this.canvas;
    let last = null;
    c.addEventListener('pointerdown', e => { last = [e.clientX, e.clientY]; c.setPointerCapture(e.pointerId); });
    c.addEventListener('pointermove', e => {
      if (!last || this.operatorTool()) return;       // the operator's camera does not orbit
      this.az -= (e.clientX - last[0]) * 0.008;
      this.el = clamp(this.el + (e.clientY - last[1]) * 0.008, -1.5, 1.5);   // short of the poles: `up` stays defined
      last = [e.clientX, e.clientY];
      this.dirty = true;
    });
    const end = () => { last = null; };
    c.addEventListener('pointerup', end);
    c.addEventListener('pointercancel', end);
    c.addEventListener('wheel', e => {
      e.preventDefault();
      this.zoom = clamp(this.zoom * Math.exp(e.deltaY * 0.0015), 0.05, 20);
      this.dirty = true;
    }, { passive: false });
    c.addEventListener('dblclick', () => { this.zoom = 1; this.refit(); });
  }

  // Fit the camera to the next state (after a reset or load the thread may be somewhere else).
  refit() { this.needsFit = true; this.dirty = true; }

  // The orbit view ({mode: 'orbit'}) or the operator view of a device ({mode: 'operator', device}); the zoom
  // starts again from 1.
  setView(view) {
    this.viewpoint = { mode: view.mode === 'operator' ? 'operator' : 'orbit', device: view.device || null };
    this.zoom = 1;
    this.dirty = true;
  }

  // The tool whose operator the camera sits with, or null in the orbit view (and while that device has no tool:
  // the camera orbits until it has).
  operatorTool() {
    if (this.viewpoint.mode !== 'operator' || !this.state) return null;
    return toolOf(this.state, this.viewpoint.device);
  }

  setState(s) {
    this.state = s;
    this.range.update(s.tension);
    if (this.needsFit) this.fit();
    this.dirty = true;
  }

  points() {
    const { x, n } = this.state;
    const pts = [];
    for (let i = 0; i < n; i++) {
      const p = [x[3 * i], x[3 * i + 1], x[3 * i + 2]];
      pts.push(p.every(isNum) ? p : null);
    }
    return pts;
  }

  pads() {
    const t = this.state.tissue;
    return t && Array.isArray(t.pads) ? t.pads.map(padBox).filter(b => b) : [];
  }

  fit() {
    const all = this.points().filter(p => p);
    for (const g of this.state.grasps) if (g.pos.every(isNum)) all.push(g.pos);
    for (const b of this.pads()) all.push(b.lo, b.hi);
    all.push(...(needlePoints(this.state.needle) || []));
    for (const t of tools(this.state)) if (t.pos.every(isNum)) all.push(t.pos);   // the jaws in view too
    if (!all.length) return;
    const lo = [0, 1, 2].map(k => Math.min(...all.map(p => p[k])));
    const hi = [0, 1, 2].map(k => Math.max(...all.map(p => p[k])));
    this.target = lo.map((v, k) => (v + hi[k]) / 2);
    this.radius = Math.max(0.5 * Math.hypot(hi[0] - lo[0], hi[1] - lo[1], hi[2] - lo[2]), 0.02);
    this.ground = lo[2] - 0.25 * this.radius;
    this.needsFit = false;
  }

  // The camera: orbiting `target` at the fitted distance, or the operator's (tools.js operatorPose). `target` and
  // `radius` (m) are what it looks at, for the grid.
  camera(w, h) {
    const tool = this.operatorTool();
    let target = this.target, radius = this.radius, back, upHint = Z_UP;
    if (tool) {
      const pose = operatorPose(tool);
      target = pose.centre;
      radius = pose.dist * Math.sin(FOV / 2) / 1.1;
      back = norm(pose.back);
      upHint = pose.up;
    } else {
      const ce = Math.cos(this.el);
      back = [ce * Math.cos(this.az), ce * Math.sin(this.az), Math.sin(this.el)];
    }
    const dist = radius / Math.sin(FOV / 2) * 1.1 * this.zoom;
    const eye = target.map((v, k) => v + dist * back[k]);
    const fwd = back.map(v => -v);
    const right = norm(cross(fwd, upHint));
    const up = cross(right, fwd);
    return { eye, fwd, right, up, dist, target, radius, near: dist * 0.02, f: (h / 2) / Math.tan(FOV / 2),
      cx: w / 2, cy: h / 2 };
  }

  // Camera-space coordinates [right, up, depth] of a scene point.
  view(cam, p) { const d = sub(p, cam.eye); return [dot(d, cam.right), dot(d, cam.up), dot(d, cam.fwd)]; }

  screen(cam, v) { return [cam.cx + cam.f * v[0] / v[2], cam.cy - cam.f * v[1] / v[2], v[2]]; }

  project(cam, p) { const v = this.view(cam, p); return v[2] < cam.near ? null : this.screen(cam, v); }

  // A 3D segment clipped to the near plane, in screen coordinates (null if wholly behind the camera).
  segment(cam, a, b) {
    let va = this.view(cam, a), vb = this.view(cam, b);
    if (va[2] < cam.near && vb[2] < cam.near) return null;
    if (va[2] < cam.near || vb[2] < cam.near) {
      const f = (cam.near - va[2]) / (vb[2] - va[2]);
      const cut = va.map((v, k) => v + (vb[k] - v) * f);
      if (va[2] < cam.near) va = cut; else vb = cut;
    }
    return [this.screen(cam, va), this.screen(cam, vb)];
  }

  line(cam, a, b) {
    const s = this.segment(cam, a, b);
    if (!s) return;
    this.ctx.beginPath();
    this.ctx.moveTo(s[0][0], s[0][1]);
    this.ctx.lineTo(s[1][0], s[1][1]);
    this.ctx.stroke();
  }

  draw() {
    const ctx = this.ctx;
    const [cw, ch] = clearCanvas(this.canvas, ctx);   // everything below in CSS pixels
    const cam = this.camera(cw, ch);
    ctx.font = '12px system-ui, sans-serif';
    const step = this.drawGrid(cam);
    this.drawAxes(cam, step);
    if (this.state) {
      this.drawBodies(cam);
      drawDepthCues(this, cam);
      drawTargets(this, cam);
      this.drawPunctures(cam);
      const labelled = drawTools(this, cam);
      this.drawGrasps(cam, labelled);
      this.drawOverlay(cw);
    } else {
      ctx.fillStyle = '#8a909c';
      ctx.fillText('waiting for a state message…', 12, 20);
    }
    this.drawLegend(ch, step);
    this.dirty = false;
  }

  drawGrid(cam) {
    const ctx = this.ctx, step = niceFloor(cam.radius / 2);
    const half = Math.ceil(1.5 * cam.radius / step) * step;
    const x0 = Math.round(cam.target[0] / step) * step, y0 = Math.round(cam.target[1] / step) * step;
    const z = this.ground;
    ctx.strokeStyle = '#242932';
    ctx.lineWidth = 1;
    for (let k = -half; k <= half + step / 2; k += step) {
      this.line(cam, [x0 + k, y0 - half, z], [x0 + k, y0 + half, z]);
      this.line(cam, [x0 - half, y0 + k, z], [x0 + half, y0 + k, z]);
    }
    return step;
  }

  // The scene frame's axes at its origin, one grid step long: x red, y green, z blue.
  drawAxes(cam, step) {
    const ctx = this.ctx, o = [0, 0, 0];
    const axes = [[[step, 0, 0], '#ef4444', 'x'], [[0, step, 0], '#22c55e', 'y'], [[0, 0, step], '#3b82f6', 'z']];
    ctx.lineWidth = 1.5;
    for (const [tip, color, name] of axes) {
      ctx.strokeStyle = color;
      this.line(cam, o, tip);
      const p = this.project(cam, tip);
      if (p) { ctx.fillStyle = color; ctx.fillText(name, p[0] + 3, p[1] - 3); }
    }
  }

  // The thread (coloured by tension), the needle and the pads. Segments are drawn far first (painter's order);
  // a segment whose midpoint is inside or behind a pad goes before the pads' faces towards the camera, so
  // tissue dims what it hides, and one in front of every pad goes after them.
  drawBodies(cam) {
    const ctx = this.ctx, { tension } = this.state, pts = this.points(), boxes = this.pads();
    const segs = [];
    const add = (a, b, color, width) => {
      const s = this.segment(cam, a, b);
      if (!s) return;
      const mid = [0, 1, 2].map(k => (a[k] + b[k]) / 2);
      segs.push({ s, color, width, depth: (s[0][2] + s[1][2]) / 2,
        behind: boxes.some(box => hidden(cam.eye, mid, box)) });
    };
    const parted = new Set(this.state.parted || []);   // where the thread broke: nothing joins the pieces
    for (let i = 0; i + 1 < pts.length; i++) {
      if (pts[i] && pts[i + 1] && !parted.has(i)) {
        add(pts[i], pts[i + 1], tensionColor(tension[i], this.range.value), 3.5);
      }
    }
    const needle = needlePoints(this.state.needle);
    if (needle) for (let k = 0; k + 1 < needle.length; k++) add(needle[k], needle[k + 1], STEEL, 4.5);
    segs.sort((a, b) => b.depth - a.depth);
    const stroke = list => {
      ctx.lineCap = 'round';
      for (const { s, color, width, depth } of list) {
        ctx.lineWidth = clamp(width * cam.dist / depth, 1.5, 9);   // nearer is thicker: a depth cue
        ctx.strokeStyle = color;
        ctx.beginPath();
        ctx.moveTo(s[0][0], s[0][1]);
        ctx.lineTo(s[1][0], s[1][1]);
        ctx.stroke();
      }
    };
    this.drawPads(cam, boxes, false);
    stroke(segs.filter(g => g.behind));
    this.drawPads(cam, boxes, true);
    stroke(segs.filter(g => !g.behind));
    if (needle) this.drawTip(cam);
  }

  // The faces of every pad that look away from the camera (front = false) or towards it (front = true): a faint
  // fill and their edges, the hidden ones dimmer.
  drawPads(cam, boxes, front) {
    const ctx = this.ctx;
    ctx.lineWidth = front ? 1.5 : 1;
    ctx.lineJoin = 'round';
    for (const { lo, hi } of boxes) {
      for (let k = 0; k < 3; k++) {
        for (const side of [0, 1]) {
          const at = side ? hi[k] : lo[k];
          if (((side ? 1 : -1) * (cam.eye[k] - at) > 0) !== front) continue;
          const u = (k + 1) % 3, v = (k + 2) % 3;
          const corners = [[lo[u], lo[v]], [hi[u], lo[v]], [hi[u], hi[v]], [lo[u], hi[v]]].map(([a, b]) => {
            const p = [0, 0, 0];
            p[k] = at; p[u] = a; p[v] = b;
            return p;
          });
          ctx.fillStyle = rgba(TISSUE, front ? 0.16 : 0.10);
          ctx.strokeStyle = front ? rgba(TISSUE, 1) : rgba(TISSUE, 0.35);
          const scr = corners.map(p => this.project(cam, p));
          if (scr.every(p => p)) {
            ctx.beginPath();
            scr.forEach((p, i) => (i ? ctx.lineTo(p[0], p[1]) : ctx.moveTo(p[0], p[1])));
            ctx.closePath();
            ctx.fill();
            ctx.stroke();
          } else {
            for (let i = 0; i < 4; i++) this.line(cam, corners[i], corners[(i + 1) % 4]);
          }
        }
      }
    }
  }

  // The needle's tip: a white dot ringed in steel.
  drawTip(cam) {
    const ctx = this.ctx, nd = this.state.needle, pts = needlePoints(nd);
    const p = this.project(cam, isVec(nd.tip) ? nd.tip : pts[pts.length - 1]);
    if (!p) return;
    ctx.beginPath();
    ctx.arc(p[0], p[1], 4, 0, 2 * Math.PI);
    ctx.fillStyle = '#f8fafc';
    ctx.fill();
    ctx.lineWidth = 1.5;
    ctx.strokeStyle = '#64748b';
    ctx.stroke();
  }

  // Each puncture: a dot where it sits on its pad, coloured by what goes through it (a ring once passed).
  drawPunctures(cam) {
    const ctx = this.ctx, t = this.state.tissue;
    if (!t || !Array.isArray(t.punctures)) return;
    for (const q of t.punctures) {
      const p = isVec(q.pos) ? this.project(cam, q.pos) : null;
      if (!p) continue;
      const color = PUNCTURE[q.on] || '#ffffff';
      drawDot(ctx, p, 4, color, q.on === 'passed');
    }
  }

  // Each grasp: a ring at its target in the device's colour, a dashed line to the point held (the coupling: the
  // vertex, or `frac` of the way along the segment after it), its device and force unless its tool says them
  // (`labelled`: devices whose tool is drawn).
  drawGrasps(cam, labelled) {
    const ctx = this.ctx, pts = this.points();
    for (const g of this.state.grasps) {
      if (!g.pos.every(isNum)) continue;
      const color = this.deviceColor(g.device);
      const a = pts[g.vertex], b = pts[g.vertex + 1];
      const vtx = a && b && isNum(g.frac) && g.frac > 0 ? a.map((v, k) => v + (b[k] - v) * g.frac) : a;
      ctx.strokeStyle = color;
      ctx.lineWidth = 1.5;
      if (vtx) { ctx.setLineDash([4, 3]); this.line(cam, g.pos, vtx); ctx.setLineDash([]); }
      const p = this.project(cam, g.pos);
      if (!p) continue;
      ctx.beginPath();
      ctx.arc(p[0], p[1], 7, 0, 2 * Math.PI);
      ctx.stroke();
      if (labelled.has(g.device)) continue;
      const f = g.force.every(isNum) ? Math.hypot(...g.force) : NaN;
      ctx.fillStyle = color;
      ctx.fillText(`${g.device}  ${fmt(f)} N`, p[0] + 11, p[1] - 8);
    }
  }

  // The time and the suture's state top left, the view top right, the contacts' count under the time.
  drawOverlay(cw) {
    const ctx = this.ctx, s = this.state;
    let text = `t = ${isNum(s.t) ? s.t.toFixed(3) : '–'} s   ${s.n} vertices`;
    if (s.tissue) text += `   ${suture(s.tissue)}`;
    ctx.fillStyle = '#8a909c';
    ctx.fillText(text, 12, 20);
    if (this.viewpoint.mode === 'operator') {
      const dev = this.viewpoint.device;
      const view = this.operatorTool() ? `operator view: ${dev}, looking along its −z`
        : `operator view: no tool ${dev ? `for ${dev} ` : ''}yet (orbiting)`;
      ctx.textAlign = 'right';
      ctx.fillText(view, cw - 12, 20);
      ctx.textAlign = 'left';
    }
    if (s.contacts > 0) {
      const text = `${s.contacts} contact${s.contacts === 1 ? '' : 's'}`;
      const w = ctx.measureText(text).width + 16;
      ctx.fillStyle = '#b91c1c';
      ctx.fillRect(12, 30, w, 20);
      ctx.fillStyle = '#fff';
      ctx.fillText(text, 20, 44);
    }
  }

  // The colour scale in newtons, and the grid spacing.
  drawLegend(ch, step) {
    this.drawTissueLegend(ch);
    const s = this.state;
    if (s && (tools(s).length || (s.tissue && Array.isArray(s.tissue.targets) && s.tissue.targets.length))) {
      drawToolLegend(this.ctx, ch - (s.tissue ? 84 : 62));
    }
    const ctx = this.ctx, r = this.range.value, x = 12, y = ch - 34, w = 180;
    const g = ctx.createLinearGradient(x, 0, x + w, 0);
    [[0, -1], [0.5, 0], [0.75, 0.5], [1, 1]].forEach(([at, f]) => g.addColorStop(at, tensionColor(f * r, r)));
    ctx.fillStyle = g;
    ctx.fillRect(x, y, w, 10);
    ctx.fillStyle = '#d5d8de';
    ctx.fillText('tension (N): − compressed, + taut', x, y - 6);
    [[-1, x, 'left'], [0, x + w / 2, 'center'], [1, x + w, 'right']].forEach(([f, px, align]) => {
      ctx.textAlign = align;
      ctx.fillText(fmt(f * r), px, y + 24);
    });
    ctx.textAlign = 'left';
    ctx.fillStyle = '#8a909c';
    ctx.fillText(`grid ${fmtLength(step)}`, x + w + 24, y + 10);
  }

  // With tissue: what the puncture dots' colours mean, above the tension scale.
  drawTissueLegend(ch) {
    if (!this.state || !this.state.tissue) return;
    const ctx = this.ctx, y = ch - 62;
    let x = 12;
    ctx.fillStyle = '#d5d8de';
    ctx.fillText('punctures:', x, y);
    x += ctx.measureText('punctures:').width + 12;
    for (const on of ['needle', 'thread', 'passed']) {
      ctx.beginPath();
      ctx.arc(x, y - 4, 4, 0, 2 * Math.PI);
      ctx.lineWidth = 2;
      if (on === 'passed') { ctx.strokeStyle = PUNCTURE[on]; ctx.stroke(); }
      else { ctx.fillStyle = PUNCTURE[on]; ctx.fill(); }
      ctx.fillStyle = '#d5d8de';
      ctx.fillText(on, x + 8, y);
      x += 8 + ctx.measureText(on).width + 14;
    }
  }
}

// The wound's closure in a line: the gap between the pads (mm), the throws tied and the knot they make.
export function suture(tissue) {
  const gap = isNum(tissue.gap) ? `${(tissue.gap * 1000).toFixed(2)} mm` : '–';
  const n = tissue.throws;
  const knot = typeof tissue.knot === 'string' && tissue.knot !== 'unknot' ? `   ${tissue.knot}` : '';
  return `gap ${gap}   ${isNum(n) ? n : '–'} throw${n === 1 ? '' : 's'}${knot}`;
}
