// Vectors (3-element arrays, m), unit quaternions [w, x, y, z] and the pads' boxes, for the scene and the tools.

import { isNum } from './util.js';

export const sub = (a, b) => [a[0] - b[0], a[1] - b[1], a[2] - b[2]];
export const add = (a, b, k = 1) => [a[0] + k * b[0], a[1] + k * b[1], a[2] + k * b[2]];
export const dot = (a, b) => a[0] * b[0] + a[1] * b[1] + a[2] * b[2];
export const cross = (a, b) => [a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]];
export const norm = a => { const l = Math.hypot(a[0], a[1], a[2]) || 1; return [a[0] / l, a[1] / l, a[2] / l]; };
export const isVec = (v, k = 3) => Array.isArray(v) && v.length === k && v.every(isNum);

// v rotated by the unit quaternion q = [w, x, y, z] (body to world): v + 2w (u x v) + 2 u x (u x v), u = (x, y, z)
export function rotate(q, v) {
  const [w, x, y, z] = q;
  const cx = y * v[2] - z * v[1], cy = z * v[0] - x * v[2], cz = x * v[1] - y * v[0];
  return [v[0] + 2 * (w * cx + y * cz - z * cy), v[1] + 2 * (w * cy + z * cx - x * cz),
    v[2] + 2 * (w * cz + x * cy - y * cx)];
}

// q normalised, or null if it is not 4 numbers of non-zero length.
export function unitQuat(q) {
  if (!isVec(q, 4)) return null;
  const l = Math.hypot(...q);
  return l > 0 ? q.map(v => v / l) : null;
}

// A pad (axis-aligned box: centre and full extents, m) as its low and high corners; null if malformed.
export function padBox(pad) {
  if (!isVec(pad.pos) || !isVec(pad.size)) return null;
  const h = pad.size.map(v => Math.abs(v) / 2);
  return { lo: pad.pos.map((v, k) => v - h[k]), hi: pad.pos.map((v, k) => v + h[k]) };
}

// The distance from p to the polyline through pts (m).
export function polylineDistance(p, pts) {
  let best = Infinity;
  for (let i = 0; i + 1 < pts.length; i++) {
    const a = pts[i], e = sub(pts[i + 1], a), ee = dot(e, e);
    const f = ee > 0 ? Math.min(1, Math.max(0, dot(sub(p, a), e) / ee)) : 0;
    const d = sub(p, add(a, e, f));
    best = Math.min(best, Math.hypot(...d));
  }
  return best;
}
