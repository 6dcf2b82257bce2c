"""Thread presets: YAML files in configs/threads/ resolved to ThreadParams in SI units.

Each physical quantity may be given one way only (a preset naming both EI and E is an error, not a
precedence rule); a scenario's `thread:` overrides replace the preset's way of giving a quantity:
- mass per length: `linear_density` (kg/m) | `mass` (kg, whole thread) | `density` (kg/m^3) with `diameter`
- bending EI: `bending_stiffness` (N*m^2) | `youngs_modulus` (Pa, EI = E pi d^4 / 64) |
  `paper_kb` (Wang 2017 Eq. 3 k_b, J per hinge: EI = k_b * l / 2, docs/PHYSICS.md)
- twisting GJ: `twisting_stiffness` (N*m^2) | `shear_modulus` (Pa, GJ = G pi d^4 / 32) |
  `poisson_ratio` (G = E / (2 (1 + nu)), with youngs_modulus) | `paper_kt` (Wang 2017 k_t = GJ, N*m^2)
- stretch EA (only with `extensible: true`): `stretch_stiffness` (N) | youngs_modulus * pi d^2 / 4
- rated strength: `knot_pull_strength` (N, the USP knot-pull minimum for the size); a segment pulled past it
  parts (solver/breakage.py). Omitted: the thread never breaks.
"""
from __future__ import annotations

import math
from pathlib import Path

from .config import ConfigError, Section, load_yaml
from .model import ThreadParams
from .sources import CONFIG_DIR, PRESET_REFUSED, FilePolicy, ScenarioFiles

THREADS_DIR = CONFIG_DIR / "threads"
# m: a thread longer than this is no suture (the scene's other limits, solver/scenario.py, assume it)
MAX_THREAD_LENGTH = 100.0

# Alternative ways of giving one quantity; an override of one member replaces the others.
GROUPS = {
    "mass": ("linear_density", "mass", "density"),
    "bending": ("bending_stiffness", "youngs_modulus", "paper_kb"),
    "twisting": ("twisting_stiffness", "shear_modulus", "poisson_ratio", "paper_kt"),
}
KEYS = ("name", "description", "length", "segments", "diameter", "linear_density", "mass", "density",
        "bending_stiffness", "youngs_modulus", "paper_kb", "twisting_stiffness", "shear_modulus",
        "poisson_ratio", "paper_kt", "air_drag", "air_drag_linear", "bending_dissipation", "contact_radius",
        "extensible", "stretch_stiffness", "friction_static", "friction_kinetic", "contact_stiffness",
        "knot_pull_strength")


def preset_names() -> list[str]:
    """Names of the shipped thread presets."""
    return sorted(p.stem for p in THREADS_DIR.glob("*.yaml"))


def preset_path(name_or_path: str, base_dir: Path | None = None) -> Path:
    """A preset by name (configs/threads/NAME.yaml) or by path ending .yaml/.yml (a relative one against
    ``base_dir``, the referring scenario's directory; None: the working directory). Not checked: a caller
    reading network input confines it (solver/sources.py)."""
    if name_or_path.endswith((".yaml", ".yml")):
        p = Path(name_or_path)
        if not p.is_absolute() and base_dir is not None:
            p = base_dir / p
        return p
    return THREADS_DIR / f"{name_or_path}.yaml"


def merged_thread_section(overrides: Section, *, base_dir: Path | None = None, policy: FilePolicy | None = None,
                          files: ScenarioFiles | None = None) -> Section:
    """The scenario's `thread:` section merged over its `preset:` (if any), remembering each key's file. The
    preset file is found and read through ``files`` (which records it), or else through a ScenarioFiles of
    ``base_dir`` (None: the directory of ``overrides.file``) and ``policy`` (None: trusted)."""
    if files is None:
        files = ScenarioFiles(Path(overrides.file).parent if base_dir is None else base_dir, policy)
    data: dict = {}
    sources: dict[str, str] = {}
    preset = overrides.get("preset", str, None)
    if preset is not None:
        path = files.locate(overrides, "preset", str(preset_path(preset)), PRESET_REFUSED)
        base = files.preset(overrides, "preset", path,
                            f"no thread preset {preset!r} (known: {', '.join(preset_names())})")
        for k, v in base.items():
            data[k] = v
            sources[k] = str(path)
    for k, v in overrides.data.items():
        if k == "preset":
            continue
        for members in GROUPS.values():
            if k in members:
                for other in members:
                    if other != k and sources.get(other, overrides.file) != overrides.file:
                        data.pop(other, None)
                        sources.pop(other, None)
        data[k] = v
        sources[k] = overrides.file
    return Section(data, overrides.file, overrides.path, sources)


def _one_of(sec: Section, keys: tuple[str, ...], what: str) -> str | None:
    given = [k for k in keys if sec.has(k) and sec.data[k] is not None]
    if len(given) > 1:
        raise sec.error(given[1], f"{what} is already given by '{given[0]}'; give it one way only")
    return given[0] if given else None


def resolve_thread(sec: Section) -> ThreadParams:
    """Turn a thread section (preset keys, SI units) into ThreadParams, validating every key."""
    name = sec.get("name", str, "thread")
    sec.get("description", str, "")
    length = sec.get("length", float, above=0.0, maxval=MAX_THREAD_LENGTH)
    segments = sec.get("segments", int, minval=1, maxval=100_000)
    seg_len = length / segments
    diameter = sec.get("diameter", float, 0.0, minval=0.0)

    def need_diameter(key: str) -> float:
        if diameter <= 0.0:
            raise sec.error(key, "needs 'diameter' (m) to be given as well")
        return diameter

    area = math.pi * diameter ** 2 / 4.0
    i_area = math.pi * diameter ** 4 / 64.0

    k = _one_of(sec, GROUPS["mass"], "the mass")
    if k == "linear_density":
        rho_a = sec.get(k, float, above=0.0)
    elif k == "mass":
        rho_a = sec.get(k, float, above=0.0) / length
    elif k == "density":
        need_diameter(k)
        rho_a = sec.get(k, float, above=0.0) * area
    else:
        raise sec.error("linear_density", "the mass is required: give linear_density, mass, or density with diameter")

    youngs = None
    k = _one_of(sec, GROUPS["bending"], "the bending stiffness")
    if k == "bending_stiffness":
        ei = sec.get(k, float, minval=0.0)
    elif k == "youngs_modulus":
        need_diameter(k)
        youngs = sec.get(k, float, above=0.0)
        ei = youngs * i_area
    elif k == "paper_kb":
        # Wang 2017 Eq. 3 read as an energy per hinge: k_b tan^2(phi/2) = K_i tan^2(phi/2) with K = 2 EI / l
        ei = sec.get(k, float, minval=0.0) * seg_len / 2.0
    else:
        raise sec.error("bending_stiffness", "the bending stiffness is required: give bending_stiffness, "
                        "youngs_modulus (with diameter) or paper_kb")

    k = _one_of(sec, GROUPS["twisting"], "the twisting stiffness")
    if k in ("twisting_stiffness", "paper_kt"):
        gj = sec.get(k, float, minval=0.0)
    elif k == "shear_modulus":
        need_diameter(k)
        gj = sec.get(k, float, above=0.0) * 2.0 * i_area
    elif k == "poisson_ratio":
        if youngs is None:
            raise sec.error(k, "needs 'youngs_modulus' to give the shear modulus (if a scenario override gave the "
                               "bending stiffness another way, it replaced the preset's youngs_modulus: give "
                               "twisting_stiffness or shear_modulus there too)")
        nu = sec.get(k, float, above=-1.0, maxval=0.5)
        gj = youngs / (2.0 * (1.0 + nu)) * 2.0 * i_area
    else:
        gj = 0.0

    extensible = sec.get("extensible", bool, False)
    if extensible:
        if sec.has("stretch_stiffness"):
            ea = sec.get("stretch_stiffness", float, above=0.0)
        elif youngs is not None:
            ea = youngs * area
        else:
            raise sec.error("extensible", "an extensible thread needs stretch_stiffness (EA, N) or youngs_modulus")
    else:
        if sec.has("stretch_stiffness"):
            raise sec.error("stretch_stiffness", "only applies with 'extensible: true'")
        sec.get("stretch_stiffness", float, None)
        ea = math.inf

    # Coulomb friction of the thread on itself (solver/contact_response.py); kinetic <= static
    mu_s = sec.get("friction_static", float, 0.0, minval=0.0, maxval=10.0)
    mu_k = sec.get("friction_kinetic", float, mu_s, minval=0.0, maxval=10.0)
    if mu_k > mu_s:
        raise sec.error("friction_kinetic", f"{mu_k} exceeds friction_static {mu_s}: kinetic friction is at "
                                            "most static")
    params = ThreadParams(
        name=name, length=length, segments=segments, linear_density=rho_a, bending_stiffness=ei,
        twisting_stiffness=gj, air_drag=sec.get("air_drag", float, 0.0, minval=0.0),
        air_drag_linear=sec.get("air_drag_linear", float, 0.0, minval=0.0),
        bending_dissipation=sec.get("bending_dissipation", float, 0.0, minval=0.0),
        contact_radius=sec.get("contact_radius", float, diameter / 2.0, minval=0.0),
        diameter=diameter, extensible=extensible, stretch_stiffness=ea,
        friction_static=mu_s, friction_kinetic=mu_k,
        contact_stiffness=sec.get("contact_stiffness", float, 0.0, minval=0.0),
        knot_pull_strength=sec.get("knot_pull_strength", float, math.inf, above=0.0))
    sec.finish()
    return params


def load_preset(name_or_path: str) -> ThreadParams:
    """Resolve a shipped preset by name, or a preset file by path."""
    path = preset_path(name_or_path)
    if not path.is_file():
        raise ConfigError(str(path), "", f"no thread preset {name_or_path!r} (known: {', '.join(preset_names())})")
    return resolve_thread(Section(load_yaml(path), str(path)))
