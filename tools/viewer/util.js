// Small helpers shared by the scene, the plot and the panel: number formatting, nice axis steps, device colours.

export const clamp = (v, lo, hi) => Math.min(hi, Math.max(lo, v));

export const isNum = v => typeof v === 'number' && Number.isFinite(v);

// The page's background, under both canvases.
const BG = '#101216';

// A marker dot of radius r at canvas point p: hollow (a ring in color) or filled with color, edged in the
// background's dark so it stands out on the thread.
export function drawDot(ctx, p, r, color, hollow) {
  ctx.beginPath();
  ctx.arc(p[0], p[1], r, 0, 2 * Math.PI);
  ctx.lineWidth = 2;
  if (hollow) {
    ctx.strokeStyle = color;
    ctx.stroke();
  } else {
    ctx.fillStyle = color;
    ctx.fill();
    ctx.strokeStyle = BG;
    ctx.lineWidth = 1;
    ctx.stroke();
  }
}

// Size a canvas's backing store to its CSS size times the device pixel ratio, fill it with the background and
// leave the context drawing in CSS pixels; returns the CSS width and height.
export function clearCanvas(canvas, ctx) {
  const dpr = window.devicePixelRatio || 1;
  const w = Math.max(1, Math.round(canvas.clientWidth * dpr)), h = Math.max(1, Math.round(canvas.clientHeight * dpr));
  if (canvas.width !== w || canvas.height !== h) { canvas.width = w; canvas.height = h; }
  ctx.setTransform(1, 0, 0, 1, 0, 0);
  ctx.fillStyle = BG;
  ctx.fillRect(0, 0, w, h);
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  return [w / dpr, h / dpr];
}

// The smallest 1, 2 or 5 x 10^k that is >= v (axis and colour-scale limits that read well).
export function niceCeil(v) {
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 5, 10]) if (m * p >= v * (1 - 1e-9)) return m * p;
  return 10 * p;
}

// The largest 1, 2 or 5 x 10^k that is <= v (grid spacings).
export function niceFloor(v) {
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [5, 2, 1]) if (m * p <= v * (1 + 1e-9)) return m * p;
  return p;
}

// A number with `digits` significant digits, or a dash for a missing/non-finite value.
export function fmt(v, digits = 3) {
  if (!isNum(v)) return '–';
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e6 || a < 1e-3)) return v.toExponential(digits - 1);
  return String(Number(v.toPrecision(digits)));
}

// A length in metres as mm / cm / m.
export function fmtLength(m) {
  if (m < 0.01) return `${fmt(m * 1000)} mm`;
  if (m < 1) return `${fmt(m * 100)} cm`;
  return `${fmt(m)} m`;
}

// A duration in seconds, as a person reads an age.
export function fmtAge(s) {
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 120) return `${s.toFixed(1)} s`;
  return `${Math.round(s / 60)} min`;
}

// One colour per device, in order of appearance, the same in the 3D view and the plot.
const PALETTE = ['#38bdf8', '#f472b6', '#a3e635', '#fb923c', '#c084fc', '#2dd4bf', '#facc15', '#94a3b8'];
const assigned = new Map();
export function deviceColor(name) {
  if (!assigned.has(name)) assigned.set(name, PALETTE[assigned.size % PALETTE.length]);
  return assigned.get(name);
}
