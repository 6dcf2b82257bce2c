"""Device-to-scene transform (docs/ARCHITECTURE.md Sec. 5.1: device units are converted at the driver boundary).

A device reports its stylus in its own frame and units (OpenHaptics: millimetres, x right, y up, z toward the
user). The scene is SI with z up. A position maps as ``p_scene = offset + scale * R p_device`` and a scene
force maps back as ``f_device = R^T f_scene`` (a force is in newtons on both sides; only the frame turns, and
the force gain is the safety pipeline's ``scale``). Orientations map as ``q_scene = q_R * q_device``.

The servo callback calls :meth:`DeviceTransform.pose_to_scene` and :meth:`DeviceTransform.force_to_device`
once per tick, so both work on plain floats into preallocated outputs and allocate no arrays.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


def rotation_from_euler_deg(rx: float, ry: float, rz: float) -> np.ndarray:
    """The 3x3 rotation ``Rz(rz) Ry(ry) Rx(rx)`` (degrees): rotate about the scene's x, then y, then z axes."""
    a, b, c = (math.radians(v) for v in (rx, ry, rz))
    rot_x = np.array([[1, 0, 0], [0, math.cos(a), -math.sin(a)], [0, math.sin(a), math.cos(a)]])
    rot_y = np.array([[math.cos(b), 0, math.sin(b)], [0, 1, 0], [-math.sin(b), 0, math.cos(b)]])
    rot_z = np.array([[math.cos(c), -math.sin(c), 0], [math.sin(c), math.cos(c), 0], [0, 0, 1]])
    return rot_z @ rot_y @ rot_x


def quat_from_matrix(m) -> tuple[float, float, float, float]:
    """Unit quaternion (w, x, y, z) of a rotation matrix given as rows ``m[i][j]`` (Shepperd's method: the
    largest of the four candidate divisors keeps it accurate for every rotation)."""
    m00, m01, m02 = m[0][0], m[0][1], m[0][2]
    m10, m11, m12 = m[1][0], m[1][1], m[1][2]
    m20, m21, m22 = m[2][0], m[2][1], m[2][2]
    tr = m00 + m11 + m22
    if tr > 0.0:
        s = math.sqrt(tr + 1.0) * 2.0
        w, x, y, z = 0.25 * s, (m21 - m12) / s, (m02 - m20) / s, (m10 - m01) / s
    elif m00 > m11 and m00 > m22:
        s = math.sqrt(1.0 + m00 - m11 - m22) * 2.0
        w, x, y, z = (m21 - m12) / s, 0.25 * s, (m01 + m10) / s, (m02 + m20) / s
    elif m11 > m22:
        s = math.sqrt(1.0 + m11 - m00 - m22) * 2.0
        w, x, y, z = (m02 - m20) / s, (m01 + m10) / s, 0.25 * s, (m12 + m21) / s
    else:
        s = math.sqrt(1.0 + m22 - m00 - m11) * 2.0
        w, x, y, z = (m10 - m01) / s, (m02 + m20) / s, (m12 + m21) / s, 0.25 * s
    n = math.sqrt(w * w + x * x + y * y + z * z)
    if not n > 0.0 or not math.isfinite(n):
        return 1.0, 0.0, 0.0, 0.0
    if w < 0.0:  # one sign for the same rotation, so consecutive samples do not flip
        n = -n
    return w / n, x / n, y / n, z / n


@dataclass(frozen=True)
class DeviceTransform:
    """Device-to-scene mapping.

    :param rotation_deg: (rx, ry, rz) in degrees, applied about the scene's x, then y, then z axes; it turns
        device axes into scene axes.
    :param scale: metres per device unit (OpenHaptics: 0.001, the device reports mm); > 0.
    :param offset: scene position (m) of the device's origin.
    """
    rotation_deg: tuple[float, float, float] = (0.0, 0.0, 0.0)
    scale: float = 1.0
    offset: tuple[float, float, float] = (0.0, 0.0, 0.0)
    _r: tuple = field(init=False, repr=False, compare=False)
    _q: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if not (math.isfinite(self.scale) and self.scale > 0.0):
            raise ValueError(f"scale must be finite and > 0, got {self.scale!r}")
        if len(self.rotation_deg) != 3 or len(self.offset) != 3 or \
                not all(math.isfinite(v) for v in (*self.rotation_deg, *self.offset)):
            raise ValueError("rotation_deg and offset must be 3 finite numbers each")
        r = rotation_from_euler_deg(*self.rotation_deg)
        object.__setattr__(self, "_r", tuple(tuple(float(v) for v in row) for row in r))
        object.__setattr__(self, "_q", quat_from_matrix(r))

    @property
    def quat(self) -> tuple[float, float, float, float]:
        """The rotation device -> scene as a unit quaternion (w, x, y, z)."""
        return self._q

    @property
    def matrix(self) -> np.ndarray:
        """The 3x3 rotation device -> scene."""
        return np.array(self._r)

    def pose_to_scene(self, px: float, py: float, pz: float, rot, pos_out, quat_out) -> None:
        """Stylus position ``(px, py, pz)`` (device units) and orientation ``rot`` (3x3 rows, device frame, or
        None for identity) into ``pos_out`` (3, m) and ``quat_out`` (4, w x y z) in the scene frame."""
        (r00, r01, r02), (r10, r11, r12), (r20, r21, r22) = self._r
        s = self.scale
        ox, oy, oz = self.offset
        pos_out[0] = ox + s * (r00 * px + r01 * py + r02 * pz)
        pos_out[1] = oy + s * (r10 * px + r11 * py + r12 * pz)
        pos_out[2] = oz + s * (r20 * px + r21 * py + r22 * pz)
        qw, qx, qy, qz = self._q
        if rot is None:
            bw, bx, by, bz = 1.0, 0.0, 0.0, 0.0
        else:
            bw, bx, by, bz = quat_from_matrix(rot)
        # Hamilton product q_R * q_device
        quat_out[0] = qw * bw - qx * bx - qy * by - qz * bz
        quat_out[1] = qw * bx + qx * bw + qy * bz - qz * by
        quat_out[2] = qw * by - qx * bz + qy * bw + qz * bx
        quat_out[3] = qw * bz + qx * by - qy * bx + qz * bw

    def force_to_device(self, fx: float, fy: float, fz: float, out) -> None:
        """Scene-frame force (N) into ``out`` (3, N) in the device frame: ``R^T f``."""
        (r00, r01, r02), (r10, r11, r12), (r20, r21, r22) = self._r
        out[0] = r00 * fx + r10 * fy + r20 * fz
        out[1] = r01 * fx + r11 * fy + r21 * fz
        out[2] = r02 * fx + r12 * fy + r22 * fz
