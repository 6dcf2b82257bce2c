"""The `suturesim` command line (docs/ARCHITECTURE.md Sec. 6).

Each subcommand's module is imported only when it runs, so `suturesim --help` is instant and a missing optional
dependency only affects the command that needs it. This table is the one place where the server names tools.
"""
from __future__ import annotations

import argparse
import sys

from ..solver.config import ConfigError


def _cmd_run(args: argparse.Namespace) -> int:
    from ..solver.scenario import load_scenario
    from .headless import run_scenario

    scenario = load_scenario(args.scenario, assignments=args.set)
    summary = run_scenario(scenario, duration=args.duration, record=args.record, progress=sys.stderr.isatty())
    for line in summary.lines():
        print(line)
    if args.record:
        print(f"recorded to {args.record}")
    return 0 if summary.finite else 1


def _cmd_serve(args: argparse.Namespace) -> int:
    from .config import load_server_config
    from .security import SecurityError
    from .supervisor import serve

    overrides = {"scenario": args.scenario, "record": args.record, "device": args.device, "replay": args.replay,
                 "endpoints": {"pub": args.pub, "control": args.control, "stylus": args.stylus,
                               "score": args.score},
                 "security": {"insecure": True} if args.insecure else {}, "trainee": args.trainee}
    cfg = load_server_config(args.config, overrides)
    try:
        return serve(cfg)
    except SecurityError as exc:
        print(f"suturesim: {exc}", file=sys.stderr)
        return 2


def _cmd_keys(args: argparse.Namespace) -> int:
    from .security import keys_main

    return keys_main(args.rest)


def _cmd_validate(args: argparse.Namespace) -> int:
    from ..tools.validate import main as validate_main

    return validate_main(args.rest)


def _cmd_bench(args: argparse.Namespace) -> int:
    from ..tools.bench import main as bench_main

    return bench_main(args.rest)


def _cmd_scenarios(args: argparse.Namespace) -> int:
    from ..solver.presets import preset_names
    from ..solver.scenario import scenario_names

    print("scenarios:", ", ".join(scenario_names()))
    print("thread presets:", ", ".join(preset_names()))
    return 0


def _cmd_view(args: argparse.Namespace) -> int:
    from ..tools.view import serve_viewer
    from .security import SecurityError, client_curve_option

    try:
        curve = client_curve_option(args.server_key, args.key)
    except SecurityError as exc:
        print(f"suturesim view: {exc}", file=sys.stderr)
        return 2
    return serve_viewer(connect=args.connect, host=args.host, port=args.port, curve=curve,
                        allow_hosts=tuple(args.allow_host))


def _cmd_plot(args: argparse.Namespace) -> int:
    from ..tools.plot import run_plot

    return run_plot(args.file, args.out, times=args.times, devices=args.devices)


def _cmd_export(args: argparse.Namespace) -> int:
    from ..tools.export import run_export

    return run_export(args.file, csv_dir=args.csv, npz=args.npz, topics=args.topics)


def build_parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per job (`suturesim --help`)."""
    parser = argparse.ArgumentParser(
        prog="suturesim",
        description="Real-time haptic suturing server: an inextensible Kirchhoff rod (Wang et al. 2017) "
                    "with axial force output.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    _add_serve(sub)

    p = sub.add_parser("keys", help="make a CURVE key pair for binding beyond loopback", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=_cmd_keys)

    p = sub.add_parser("run", help="run a scenario headless, as fast as possible",
                       description="Run a scenario headless as fast as the machine allows and print a summary "
                                   "ending in the final state's SHA-256 digest (equal digests: the same run bit "
                                   "for bit); optionally record the state (at the scenario's rate) and force "
                                   "(every tick) topics to an MCAP file.")
    p.add_argument("scenario", help="a shipped scenario name (see `suturesim scenarios`) or a YAML file")
    p.add_argument("--duration", type=float, help="simulated seconds (default: the scenario's duration)")
    p.add_argument("--record", metavar="OUT.mcap", help="record the published messages to this MCAP file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="change the scenario before the run: a dotted key path and a YAML value, a number indexing "
                        "a list (e.g. shape.start=[0.0015,0,0.0143908] or boundary.grasps.0.max_force=6); repeat "
                        "for several; checked as the scenario file is")
    p.set_defaults(func=_cmd_run)

    _add_view(sub)

    p = sub.add_parser("validate", help="run the validation cases (Wang et al. 2017 Sec. 6) and print a table",
                       add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=_cmd_validate)

    p = sub.add_parser("bench", help="run the benchmarks and print a table", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser("record", help="record a running server to MCAP (lossless, with its scenario)",
                       add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=_cmd_record)

    p = sub.add_parser("replay", help="replay a recording: republish it, resimulate it, or play it on a device",
                       add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=_cmd_replay)

    _add_plot(sub)
    _add_export(sub)
    _add_score(sub)

    p = sub.add_parser("scenarios", help="list the shipped scenarios and thread presets")
    p.set_defaults(func=_cmd_scenarios)
    return parser


def _add_serve(sub: argparse._SubParsersAction) -> None:
    """`suturesim serve`: the daemon and its endpoints."""
    p = sub.add_parser("serve", help="the daemon: a 1 kHz physics process publishing over ZeroMQ",
                       description="Run the real-time server: the physics process steps the scenario at 1 kHz, "
                                   "publishes state/force/stats/event on --pub, answers control requests on "
                                   "--control and takes remote stylus poses on --stylus (docs/PROTOCOL.md). "
                                   "Every socket binds 127.0.0.1 unless told otherwise; a non-loopback address "
                                   "needs CURVE keys in the config (`suturesim keys`) or --insecure. "
                                   "SIGINT/SIGTERM zero the forces and stop cleanly.")
    p.add_argument("--config", metavar="F", help="server config YAML (default: the shipped configs/server.yaml)")
    p.add_argument("--scenario", metavar="S", help="scenario name or file (default: the config's, 'default')")
    p.add_argument("--device", choices=["simulated", "openhaptics", "remote", "replay"],
                   help="the backend of every stylus not configured otherwise (config `devices`): simulated "
                        "(default): the scenario's scripted stylus motions; openhaptics: Phantom/Touch devices "
                        "through OpenHaptics (libHD.so), forces through the safety pipeline; remote: poses "
                        "arriving on --stylus (docs/PROTOCOL.md), the grasps hold still until then; replay: the "
                        "stylus poses of a recording (--replay F.mcap). Only a remote device takes samples from "
                        "--stylus (this flag, or `devices.<name>.backend: remote`); a sample for any other device "
                        "is rejected and counted")
    p.add_argument("--replay", metavar="F.mcap", help="the recording whose stylus poses --device replay plays")
    p.add_argument("--pub", metavar="EP", help="PUB endpoint (default tcp://127.0.0.1:5555)")
    p.add_argument("--control", metavar="EP", help="REP control endpoint (default tcp://127.0.0.1:5556)")
    p.add_argument("--stylus", metavar="EP", help="PULL remote stylus endpoint (default tcp://127.0.0.1:5557)")
    p.add_argument("--score", metavar="EP",
                   help="PUB endpoint of the live score: topic `score` at 2 Hz and `score` events at each phase's "
                        "end, from a scorer process beside the physics (default tcp://127.0.0.1:5558; off: no live "
                        "score)")
    p.add_argument("--record", metavar="F.mcap", help="record every published message to this MCAP file")
    p.add_argument("--trainee", metavar="NAME",
                   help="who is at the styluses: named in every recording's metadata, which `suturesim score` "
                        "reports (1 to 64 printable characters)")
    p.add_argument("--insecure", action="store_true",
                   help="allow binding non-loopback addresses without CURVE authentication (trusted networks only)")
    p.set_defaults(func=_cmd_serve)


def _add_view(sub: argparse._SubParsersAction) -> None:
    """`suturesim view`: the live web page."""
    p = sub.add_parser("view", help="a live web page of a server: the thread in 3D, forces, loop statistics",
                       description="Serve a local web page that shows a running server live: the thread in 3D "
                                   "coloured by tension (drag to orbit, wheel to zoom), its grasps and contacts, "
                                   "a 10 s plot of each device's force and axial force, the loop statistics and "
                                   "the connection status. It subscribes to the PUB endpoint --connect (a "
                                   "`suturesim serve`, or anything publishing the same messages, such as a "
                                   "replay) and serves the page and its WebSocket (/ws) on --host:--port; the "
                                   "page needs no internet. The page gets ~30 updates a second: the newest state "
                                   "only, forces folded into a few peak points per device, every stats and event; "
                                   "a slow browser gets fewer updates and never backs up the bridge. Ctrl-C "
                                   "stops.")
    p.add_argument("--connect", metavar="EP", default="tcp://127.0.0.1:5555",
                   help="the PUB endpoint to subscribe to (default tcp://127.0.0.1:5555)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address the page is served on (default 127.0.0.1; any other address warns: the page "
                        "has no authentication). Against DNS rebinding, a request's Host header must name "
                        "localhost or a loopback address; beyond loopback also any IP address, --host itself, "
                        "this machine's own names (hostname, FQDN) or an --allow-host name")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="one more host name the page may be opened by (e.g. a DNS alias of this machine); "
                        "repeatable")
    p.add_argument("--port", type=int, default=8765,
                   help="TCP port of the page and its WebSocket (default 8765; 0 picks a free one)")
    p.add_argument("--server-key", metavar="F",
                   help="the server's public key file (.key), for a server with CURVE; needs --key")
    p.add_argument("--key", metavar="F",
                   help="this client's secret key file (.key_secret, mode 0600; its public .key must be in the "
                        "server's client_keys_dir); needs --server-key")
    p.set_defaults(func=_cmd_view)


def _add_plot(sub: argparse._SubParsersAction) -> None:
    """`suturesim plot`: a recording drawn to PNG."""
    p = sub.add_parser("plot", help="plot a recording to PNG: forces, tension along the thread, loop lateness",
                       description="Draw one PNG of an MCAP recording: (a) each device's |force| and axial force "
                                   "(N) against scene time (s); (b) the tension (N) along the thread against arc "
                                   "length (m) at a few scene times, each snapped to the nearest state message; "
                                   "(c) a histogram of the per-second p99 and max tick lateness (µs) from the "
                                   "stats messages (a headless `suturesim run` has none, and the panel says so). "
                                   "Titled with the recorded scenario's name. Needs matplotlib: "
                                   "pip install 'suturesim[plot]'. Exit code 2 for an unreadable file.")
    p.add_argument("file", metavar="F.mcap", help="the recording")
    p.add_argument("-o", "--out", required=True, metavar="OUT.png", help="the PNG to write (1000 x 1200 px)")
    p.add_argument("--times", metavar="T1,T2,...",
                   help="scene times (s) of the tension curves (default: 4 evenly spaced over the recording)")
    p.add_argument("--devices", metavar="D1,D2",
                   help="devices whose forces to draw (default: every device in the recording)")
    p.set_defaults(func=_cmd_plot)


def _add_export(sub: argparse._SubParsersAction) -> None:
    """`suturesim export`: a recording as CSV files or NPZ."""
    p = sub.add_parser("export", help="export a recording as CSV files or one NPZ archive, numbers exact",
                       description="Decode an MCAP recording into tables for analysis elsewhere: --csv DIR "
                                   "writes force.csv, state.csv (one row per message, wide: x{i}_x/_y/_z "
                                   "positions in m, tension{i} in N), stats.csv (keys flattened with dots, "
                                   "lateness_us.p99 ...) and events.csv (details as JSON), one per topic with "
                                   "messages; --npz OUT.npz writes numpy arrays per topic and device "
                                   "(force/<device>/t, state/x (m, n, 3) float32, ...) and the metadata as JSON. "
                                   "Every number reads back exactly (the layouts: the docstring of "
                                   "tools/export.py). Exit code 2 for an unreadable file.")
    p.add_argument("file", metavar="F.mcap", help="the recording")
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument("--csv", metavar="DIR", help="write one CSV file per topic into DIR (created if needed)")
    out.add_argument("--npz", metavar="OUT.npz", help="write one compressed numpy archive")
    p.add_argument("--topics", metavar="T,...",
                   help="topics to export, comma-separated (default all: state,force,stats,event)")
    p.set_defaults(func=_cmd_export)


def _add_score(sub: argparse._SubParsersAction) -> None:
    """`suturesim score`: a suture attempt scored from its recording."""
    p = sub.add_parser("score", help="score a suture attempt from its recording, FLS-style (docs/ASSESSMENT.md)",
                       description="Read an MCAP recording of a suture and print its report: the time of each "
                                   "phase (s), where the needle went in and came out against the scene's marks "
                                   "(mm), the bite's depth, extra punctures and withdrawals, the thread's peak "
                                   "tension (N), the knot and the wound's gap, each tool's path length, idle "
                                   "time, grasps and clutches, needle drops, the penalties and an FLS-style "
                                   "score (600 s - time - penalties, floored at 0), and a pass/fail table against "
                                   "the FLS intracorporeal suturing benchmarks (112 s, 1 mm, a square knot). "
                                   "Given a directory, one CSV row per recording in it. Exit code 2 for a file "
                                   "that cannot be scored.")
    p.add_argument("target", metavar="F.mcap|DIR", help="a recording, or a directory of recordings")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object instead")
    p.add_argument("--benchmarks", metavar="DIR",
                   help="judge against an instructor's benchmarks instead of the FLS's: the expert recordings in "
                        "DIR that finished set each metric's limit (time, worst mark, path of all tools, peak "
                        "tension, penalty points) at the largest value among them; a square knot and a closed "
                        "wound are still required")
    p.add_argument("--html", metavar="OUT.html",
                   help="also write a one-page HTML report: the score and benchmarks, the phase timeline, the "
                        "force on each hand, the thread's tension and the wound's gap against time, the entry and "
                        "exit against the marks")
    p.add_argument("--security", metavar="N", type=float, nargs="?", const=1.0, default=None,
                   help="also run the knot security test: the recording resimulated to its end, every hand let go, "
                        "the thread's two ends pulled away from the knot with N newtons each (default 1) and held "
                        "5 s; a knot still slipping at the end (over 1 mm in the last 2 s) is penalised, one that "
                        "pulls through or lets the wound open scores 0 (docs/ASSESSMENT.md Sec. 5; a recording, "
                        "not a directory)")
    p.set_defaults(func=_cmd_score)


def _cmd_score(args: argparse.Namespace) -> int:
    from ..tools.score import run_score

    return run_score(args.target, args.json, html=args.html, benchmarks=args.benchmarks, security=args.security)


def _cmd_record(args: argparse.Namespace) -> int:
    from ..tools.record import main as record_main

    return record_main(args.rest)


def _cmd_replay(args: argparse.Namespace) -> int:
    from ..tools.replay import main as replay_main

    return replay_main(args.rest)


# commands that parse their own options (argparse's REMAINDER cannot take a leading --option)
_PASSTHROUGH = {"validate": _cmd_validate, "bench": _cmd_bench, "keys": _cmd_keys, "record": _cmd_record,
                "replay": _cmd_replay}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in _PASSTHROUGH:
        args = argparse.Namespace(rest=argv[1:], func=_PASSTHROUGH[argv[0]])
    else:
        args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"suturesim: configuration error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
