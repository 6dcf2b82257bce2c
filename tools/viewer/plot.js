// The force plot: the last WINDOW_S of simulated time, one colour per device, |force| solid and axial dashed.
// Points arrive already decimated by the bridge: [t (s), |force| (N), axial (N), flags].

import { clearCanvas, fmt, isNum, niceCeil } from './util.js';

const WINDOW_S = 10;
const MARGIN = { left: 64, right: 14, top: 26, bottom: 24 };

export class ForcePlot {
  constructor(canvas, deviceColor) {
    this.canvas = canvas;
    this.ctx = canvas.getContext('2d');
    this.deviceColor = deviceColor;
    this.traces = new Map();    // device -> points, oldest first
    this.tLatest = null;        // newest simulated time seen (s): the right edge
    this.dirty = true;
  }

  clear() { this.traces.clear(); this.tLatest = null; this.dirty = true; }

  add(device, points) {
    for (const p of points) {
      if (!isNum(p[0])) continue;
      // simulated time restarted (reset, load, a replay started over): the old curves mean nothing now
      if (this.tLatest !== null && p[0] < this.tLatest - 0.1) this.clear();
      if (!this.traces.has(device)) this.traces.set(device, []);
      this.traces.get(device).push(p);
      if (this.tLatest === null || p[0] > this.tLatest) this.tLatest = p[0];
    }
    this.dirty = true;
  }

  // Forget points that scrolled out, and devices with none left.
  prune() {
    const cutoff = this.tLatest - WINDOW_S - 0.5;
    for (const [dev, pts] of this.traces) {
      let k = 0;
      while (k < pts.length && pts[k][0] < cutoff) k++;
      if (k) pts.splice(0, k);
      if (!pts.length) this.traces.delete(dev);
    }
  }

  draw() {
    const ctx = this.ctx;
    const [cw, ch] = clearCanvas(this.canvas, ctx);
    ctx.font = '11px system-ui, sans-serif';
    this.dirty = false;
    const pw = cw - MARGIN.left - MARGIN.right, ph = ch - MARGIN.top - MARGIN.bottom;
    if (this.tLatest === null || pw < 10 || ph < 10) {
      ctx.fillStyle = '#8a909c';
      ctx.fillText('force (N): waiting for force messages…', MARGIN.left, MARGIN.top);
      return;
    }
    this.prune();
    const t1 = this.tLatest, t0 = t1 - WINDOW_S;
    let top = 0.01;
    for (const pts of this.traces.values()) {
      for (const p of pts) if (p[0] >= t0) top = Math.max(top, isNum(p[1]) ? p[1] : 0, isNum(p[2]) ? p[2] : 0);
    }
    top = niceCeil(top);
    const X = t => MARGIN.left + (t - t0) / WINDOW_S * pw;
    const Y = f => MARGIN.top + ph - f / top * ph;

    // grid: a line per simulated second, four force divisions
    ctx.strokeStyle = '#242932';
    ctx.fillStyle = '#8a909c';
    ctx.lineWidth = 1;
    ctx.textAlign = 'center';
    for (let t = Math.ceil(t0); t <= t1; t += 1) {
      ctx.beginPath(); ctx.moveTo(X(t), MARGIN.top); ctx.lineTo(X(t), MARGIN.top + ph); ctx.stroke();
      if (t % 2 === 0) ctx.fillText(`${t} s`, X(t), ch - 8);
    }
    ctx.textAlign = 'right';
    for (let k = 0; k <= 4; k++) {
      const f = top * k / 4;
      ctx.beginPath(); ctx.moveTo(MARGIN.left, Y(f)); ctx.lineTo(MARGIN.left + pw, Y(f)); ctx.stroke();
      ctx.fillText(`${fmt(f)} N`, MARGIN.left - 6, Y(f) + 4);
    }
    ctx.textAlign = 'left';

    // traces, clipped to the plot area
    ctx.save();
    ctx.beginPath();
    ctx.rect(MARGIN.left, MARGIN.top, pw, ph);
    ctx.clip();
    ctx.lineWidth = 1.5;
    for (const [dev, pts] of this.traces) {
      ctx.strokeStyle = this.deviceColor(dev);
      for (const [col, dash] of [[1, []], [2, [5, 3]]]) {
        ctx.setLineDash(dash);
        ctx.beginPath();
        let pen = false;
        for (const p of pts) {
          if (!isNum(p[col])) { pen = false; continue; }     // a non-finite force leaves a gap
          if (pen) ctx.lineTo(X(p[0]), Y(p[col])); else ctx.moveTo(X(p[0]), Y(p[col]));
          pen = true;
        }
        ctx.stroke();
      }
    }
    ctx.restore();
    ctx.setLineDash([]);

    // legend along the top
    let x = MARGIN.left;
    ctx.fillStyle = '#d5d8de';
    ctx.fillText('force (N):', x, 14);
    x += ctx.measureText('force (N):').width + 12;
    for (const dev of this.traces.keys()) {
      ctx.strokeStyle = ctx.fillStyle = this.deviceColor(dev);
      for (const [label, dash] of [[`${dev} |force|`, []], ['axial', [5, 3]]]) {
        ctx.setLineDash(dash);
        ctx.beginPath(); ctx.moveTo(x, 10); ctx.lineTo(x + 18, 10); ctx.stroke();
        ctx.fillText(label, x + 22, 14);
        x += 22 + ctx.measureText(label).width + 14;
      }
    }
    ctx.setLineDash([]);
  }
}
