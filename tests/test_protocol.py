"""Wire protocol v1: round trips, determinism, float32 conversion, malformed input."""

import msgpack
import numpy as np
import pytest

from suturesim.server import protocol as P
from suturesim.server.protocol import ProtocolError


def _state_args(n=7, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3))
    tension = rng.normal(size=n - 1)
    grasps = [{"id": "g0", "vertex": 3, "device": "left", "pos": np.array([0.1, 0.2, 0.3]),
               "force": [1.0, -2.0, 0.5]}]
    return dict(seq=42, t=0.042, x=x, tension=tension, twist=0.25, grasps=grasps, contacts=2,
                energy={"kinetic": 1e-4, "elastic": 2e-3, "gravity": -1e-3},
                solver={"iters": 12, "residual": 3e-9, "substeps": 4})


def test_constants():
    assert P.SCHEMA_VERSION == 1
    assert (P.TOPIC_STATE, P.TOPIC_FORCE, P.TOPIC_STATS, P.TOPIC_EVENT) == (b"state", b"force", b"stats", b"event")
    assert (P.FLAG_CLAMPED, P.FLAG_SLEWED, P.FLAG_WATCHDOG, P.FLAG_FAULT) == (1, 2, 4, 8)
    assert P.MAX_MESSAGE_BYTES == 16 * 1024 * 1024
    assert issubclass(ProtocolError, ValueError)


def test_state_round_trip_float32_and_determinism():
    a = _state_args()
    payload = P.encode_state(**a)
    assert payload == P.encode_state(**_state_args())  # byte-exact determinism
    # x/tension travel as raw little-endian float32 bytes
    raw = msgpack.unpackb(payload, raw=False)
    assert raw["x"] == a["x"].astype("<f4").tobytes() and len(raw["x"]) == 7 * 3 * 4
    assert raw["tension"] == a["tension"].astype("<f4").tobytes()

    m = P.decode(payload, P.TOPIC_STATE)
    assert (m["v"], m["seq"], m["t"], m["n"]) == (1, 42, 0.042, 7)
    assert m["x"].dtype == np.float32 and m["x"].shape == (7, 3)
    assert m["tension"].dtype == np.float32 and m["tension"].shape == (6,)
    np.testing.assert_array_equal(m["x"], a["x"].astype(np.float32))
    np.testing.assert_array_equal(m["tension"], a["tension"].astype(np.float32))
    assert m["twist"] == 0.25 and m["contacts"] == 2
    assert m["grasps"] == [{"id": "g0", "vertex": 3, "device": "left", "holds": "thread", "frac": 0.0,
                            "pos": [0.1, 0.2, 0.3], "force": [1.0, -2.0, 0.5]}]
    assert m["energy"] == a["energy"]
    assert m["solver"] == a["solver"]
    # same thing through the other entry points
    assert P.decode_state(payload)["seq"] == 42
    assert P.decode(payload)["x"].shape == (7, 3)  # topic inferred
    topic, m2 = P.decode_multipart([P.TOPIC_STATE, payload])
    assert topic == b"state" and m2["n"] == 7


def test_state_input_dtypes_do_not_change_bytes():
    a = _state_args()
    b = dict(a, x=np.asfortranarray(a["x"].astype(np.float32)), tension=list(a["tension"]),
             seq=np.int64(42), t=np.float64(0.042), contacts=np.int32(2))
    assert P.encode_state(**a) == P.encode_state(**b)


def test_force_round_trip():
    args = (7, 0.007, "left", np.array([0.01, 0.02, 0.03]), (0.5, -0.25, 1.0), 1.5, P.FLAG_CLAMPED | P.FLAG_SLEWED)
    payload = P.encode_force(*args)
    assert payload == P.encode_force(*args)
    m = P.decode(payload, "force")
    assert m == {"v": 1, "seq": 7, "t": 0.007, "device": "left", "pose": [0.01, 0.02, 0.03],
                 "stylus": [0.01, 0.02, 0.03], "force": [0.5, -0.25, 1.0], "axial": 1.5, "flags": 3}
    assert P.decode_force(payload) == m
    assert P.decode(payload) == m  # inferred


def test_event_round_trip_and_key_order_independence():
    p1 = P.encode_event(5, 0.5, "grasp", device="left", vertex=3, info={"b": 1, "a": np.float64(2.0)})
    p2 = P.encode_event(5, 0.5, "grasp", info={"a": 2.0, "b": 1}, vertex=3, device="left")
    assert p1 == p2
    m = P.decode_event(p1)
    assert m == {"v": 1, "seq": 5, "t": 0.5, "kind": "grasp", "device": "left", "vertex": 3,
                 "info": {"a": 2.0, "b": 1}}
    with pytest.raises(ProtocolError):
        P.encode_event(1, 0.0, "reset", v=3)


def test_stats_round_trip():
    stats = {"lateness_us": {"p50": 3.0, "p99": 20.0, "p99.9": 45.0, "max": 80.0}, "overruns": 0,
             "substeps": np.int64(4)}
    payload = P.encode_stats(1000, 1.0, stats)
    assert payload == P.encode_stats(1000, 1.0, dict(reversed(list(stats.items()))))
    m = P.decode(payload, b"stats")
    assert m["lateness_us"]["p99.9"] == 45.0 and m["overruns"] == 0 and m["substeps"] == 4
    assert P.decode_stats(payload) == m


def test_encode_rejects_bad_input():
    a = _state_args()
    with pytest.raises(ProtocolError):
        P.encode_state(**dict(a, x=np.zeros((7, 2))))
    with pytest.raises(ProtocolError):
        P.encode_state(**dict(a, tension=np.zeros(7)))
    with pytest.raises(ProtocolError):
        P.encode_state(**dict(a, energy={"kinetic": 0.0}))
    with pytest.raises(ProtocolError):
        P.encode_force(0, 0.0, "d", [0, 0], [0, 0, 0], 0.0, 0)
    with pytest.raises(ProtocolError):
        P.encode_stats(0, 0.0, {"blob": object()})
    with pytest.raises(ProtocolError):
        P.encode_stats(0, 0.0, {"blob": b"\0" * (P.MAX_MESSAGE_BYTES + 1)})


def _repack(payload, **changes):
    m = msgpack.unpackb(payload, raw=False)
    for k, v in changes.items():
        if v is KeyError:
            del m[k]
        else:
            m[k] = v
    return msgpack.packb(m, use_bin_type=True)


@pytest.mark.parametrize("make_bad, topic, match", [
    (lambda s, f: b"\xc1garbage", "state", "msgpack"),
    (lambda s, f: s + b"\x00", "state", "msgpack"),                       # trailing bytes
    (lambda s, f: s[:-3], "state", "msgpack"),                            # truncated
    (lambda s, f: msgpack.packb([1, 2, 3]), "force", "map"),
    (lambda s, f: msgpack.packb("hello"), "event", "map"),
    (lambda s, f: _repack(s, v=2), "state", "version"),
    (lambda s, f: _repack(s, v=KeyError), "state", "'v'"),
    (lambda s, f: _repack(s, seq="1"), "state", "seq"),
    (lambda s, f: _repack(s, seq=-1), "state", "seq"),
    (lambda s, f: _repack(s, t="now"), "state", "'t'"),
    (lambda s, f: _repack(s, x=KeyError), "state", "'x'"),
    (lambda s, f: _repack(s, x=b"\0" * 10), "state", "bytes"),            # wrong array byte length
    (lambda s, f: _repack(s, tension=b"\0" * 4), "state", "bytes"),
    (lambda s, f: _repack(s, x=[0.0] * 21), "state", "'x'"),              # wrong type
    (lambda s, f: _repack(s, n=0), "state", "n"),
    (lambda s, f: _repack(s, twist=None), "state", "twist"),
    (lambda s, f: _repack(s, grasps=[{"id": "g"}]), "state", "vertex"),
    (lambda s, f: _repack(s, grasps=[{"id": "g", "vertex": 99, "device": "d", "pos": [0, 0, 0],
                                      "force": [0, 0, 0]}]), "state", "range"),
    (lambda s, f: _repack(s, energy={"kinetic": 0.0}), "state", "elastic"),
    (lambda s, f: _repack(s, solver={"iters": 1.5, "residual": 0.0}), "state", "iters"),
    (lambda s, f: _repack(f, pose=[0.0, 0.0]), "force", "pose"),
    (lambda s, f: _repack(f, force=[0.0, "a", 0.0]), "force", "force"),
    (lambda s, f: _repack(f, flags=True), "force", "flags"),
    (lambda s, f: _repack(f, device=KeyError), "force", "device"),
    (lambda s, f: _repack(f, axial=KeyError), "force", "axial"),
    (lambda s, f: msgpack.packb({"v": 1, "seq": 0, "t": 0.0}), "event", "kind"),
    (lambda s, f: msgpack.packb({1: 2}), "stats", "msgpack"),             # non-string keys
    (lambda s, f: b"\0" * (P.MAX_MESSAGE_BYTES + 1), "stats", "cap"),
    (lambda s, f: "not bytes", "stats", "bytes"),
])
def test_malformed_inputs_raise_protocol_error(make_bad, topic, match):
    good_state = P.encode_state(**_state_args())
    good_force = P.encode_force(1, 0.001, "left", [0, 0, 0], [0, 0, 0], 0.0, 0)
    bad = make_bad(good_state, good_force)
    with pytest.raises(ProtocolError, match=match):
        P.decode(bad, topic)


def test_unknown_topic_and_bad_multipart():
    payload = P.encode_stats(0, 0.0, {})
    with pytest.raises(ProtocolError, match="topic"):
        P.decode(payload, b"bogus")
    with pytest.raises(ProtocolError, match="frame"):
        P.decode_multipart([payload])


@pytest.mark.timed   # a call's wall time
def test_large_state_encodes_fast():
    import time
    a = _state_args(n=2000)
    t0 = time.perf_counter()
    for _ in range(200):
        P.encode_state(**a)
    per_call = (time.perf_counter() - t0) / 200
    assert per_call < 2e-3, per_call  # no per-vertex Python work


def _suture_state(tissue: dict | None = None, needle: dict | None = None) -> bytes:
    x = np.zeros((3, 3))
    x[:, 0] = [0.0, 0.01, 0.02]
    return P.encode_state(5, 0.005, x, np.zeros(2), 0.0, [], 0, {"kinetic": 0.0, "elastic": 0.0, "gravity": 0.0},
                          {"iters": 1, "residual": 0.0, "substeps": 1}, tissue=tissue, needle=needle)


def test_a_sorted_map_is_sent_as_built_and_any_other_map_in_sorted_order():
    """SortedMap skips the copy into sorted key order; a plain map in any order encodes to the same bytes."""
    tissue = {"pads": [{"size": [0.02, 0.03, 0.01], "id": "left", "pos": [0.0, 0.0, -0.005]}],
              "punctures": [{"pad": "left", "pos": [0.0, 0.0, 0.0], "on": "needle", "drag": 0.1}],
              "throws": 2, "gap": None, "knot": "square knot", "linking": 0.0}
    built = P.SortedMap(gap=None, knot="square knot", linking=0.0,
                        pads=[P.SortedMap(id="left", pos=[0.0, 0.0, -0.005], size=[0.02, 0.03, 0.01])],
                        punctures=[P.SortedMap(drag=0.1, on="needle", pad="left", pos=[0.0, 0.0, 0.0])], throws=2)
    assert _suture_state(built) == _suture_state(tissue)
    # built out of order it is sent out of order: the builder's promise, not checked at 100 Hz
    unsorted = P.SortedMap(throws=2, gap=None, knot="square knot", linking=0.0, pads=[], punctures=[])
    assert _suture_state(unsorted) != _suture_state(dict(unsorted))
    assert P.decode(_suture_state(unsorted), P.TOPIC_STATE)["tissue"]["throws"] == 2


def test_state_tissue_and_needle_round_trip_and_bad_ones_are_rejected():
    tissue = {"pads": [{"id": "left", "pos": [0.0, 0.0, -0.005], "size": [0.02, 0.03, 0.01]}],
              "punctures": [{"pad": "left", "pos": [0.0, 0.0, 0.0], "on": "needle", "drag": 0.1}],
              "gap": None, "knot": "square knot", "throws": 2, "linking": 0.0}
    needle = {"pos": [0.0, 0.0, 0.01], "quat": [1.0, 0.0, 0.0, 0.0], "radius": 0.008, "arc": 2.36,
              "tip": [0.01, 0.0, 0.0], "torque": [0.0, 0.0, 0.0]}
    m = P.decode(_suture_state(tissue, needle), P.TOPIC_STATE)
    assert m["tissue"]["pads"][0]["id"] == "left" and m["tissue"]["punctures"][0]["on"] == "needle"
    assert m["tissue"]["knot"] == "square knot"
    assert m["needle"]["radius"] == 0.008 and m["needle"]["quat"] == [1.0, 0.0, 0.0, 0.0]
    assert "tissue" not in P.decode(_suture_state(), P.TOPIC_STATE)     # a scene without tissue: no key
    bad = dict(tissue, punctures=[dict(tissue["punctures"][0], on="bogus")])
    with pytest.raises(ProtocolError, match=r"state.tissue.punctures\[0\]: on must be needle, thread or passed"):
        P.decode(_suture_state(bad), P.TOPIC_STATE)
    on_thread = dict(tissue["punctures"][0], on="thread", id=3, arc=0.0415)
    assert P.decode(_suture_state(dict(tissue, punctures=[on_thread])), P.TOPIC_STATE)["tissue"]["punctures"][0][
        "arc"] == 0.0415
    for key, val in (("arc", "far"), ("id", 1.5)):
        with pytest.raises(ProtocolError, match=rf"state.tissue.punctures\[0\]: key '{key}' must be"):
            P.decode(_suture_state(dict(tissue, punctures=[dict(on_thread, **{key: val})])), P.TOPIC_STATE)
    with pytest.raises(ProtocolError, match=r"state.tissue.pads\[0\]"):
        P.decode(_suture_state(dict(tissue, pads=[7])), P.TOPIC_STATE)
    with pytest.raises(ProtocolError, match=r"state.tissue.*knot"):
        P.decode(_suture_state(dict(tissue, knot=2)), P.TOPIC_STATE)
    with pytest.raises(ProtocolError, match=r"state.needle: quat must be 4 numbers"):
        P.decode(_suture_state(tissue, dict(needle, quat=[1.0, 0.0])), P.TOPIC_STATE)
