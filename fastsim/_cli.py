"""Command line: ``fastsim demo``, ``run``, ``sweep``, ``compare``, ``capacity``,
``calibrate``, ``plot`` and ``compile``.

Good manners: Ctrl-C or SIGTERM stops a run or a sweep within
about a second, prints no traceback, keeps (prints and, with ``--out``,
saves, marked ``partial``) what had finished and exits 130 (143 for
SIGTERM); a closed pipe (``| head``) ends quietly; output paths are probed
before a run, and a failing write never loses the results.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import tempfile
import threading
import time
import tomllib
from pathlib import Path

from ._cuda import BackendUnavailableError
from ._io import check_output_dir, check_table_path, read_table, save_table
from ._replicate import metric_unit

EXAMPLE = Path(__file__).parent / "examples" / "a10g_sharegpt.toml"
RUN_KEYS = ("n_replications", "seed", "confidence_level", "precision", "max_replications", "n_threads")
#: The distribution's name on PyPI (``fastsim`` there is another project); the import name is ``fastsim``.
DISTRIBUTION = "fastsim-llm"
#: An SLO above these (seconds) looks like milliseconds typed for seconds.
MS_LIKE_S = {"ttft": 20.0, "tpot": 1.0, "itl": 1.0}
#: Metrics shown by `fastsim compare` unless --metrics says otherwise.
COMPARE_METRICS = ("ttft_mean", "ttft_p99", "tpot_mean", "e2e_mean", "e2e_p99", "request_throughput",
                   "goodput", "preemptions_per_request")
#: Compiling a kernel on a 2-core machine (compile_kernels' figure); shown with the message.
COMPILE_S = "15-30"
EXIT_INTERRUPTED = 130      # 128 + SIGINT, the shells' convention
EXIT_TERMINATED = 143       # 128 + SIGTERM


def _version() -> str:
    from . import __version__

    return f"fastsim {__version__} (PyPI distribution {DISTRIBUTION}; Python {sys.version.split()[0]})"


def _parser():
    p = argparse.ArgumentParser(prog="fastsim", description="Simulate an LLM inference server with confidence.")
    p.add_argument("--version", action="version", version=_version())
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp):
        sp.add_argument("--replications", type=int, help="independent replications (overrides [run])")
        sp.add_argument("--seed", type=int, help="random seed (overrides [run])")
        sp.add_argument("--confidence-level", type=float, help="e.g. 0.95 (overrides [run])")
        sp.add_argument("--threads", type=int, help="Numba threads")
        sp.add_argument("--backend", choices=["numba", "cuda", "reference"], default=None)
        sp.add_argument("--format", choices=["table", "json", "csv"], default="table")
        sp.add_argument("--out", type=Path, help="also write the summary here (.csv, .json or .parquet)")
        sp.add_argument("--per-replication", type=Path,
                        help="write the per-replication table here (.csv, .json or .parquet)")
        sp.add_argument("--no-progress", action="store_true", help="hide the progress bar and messages")

    run = sub.add_parser("run", help="simulate the scenario of a TOML file")
    run.add_argument("config", type=Path, help="TOML with [engine], [workload], [latency], [slo], [run] "
                                               "(docs/toml-reference.md)")
    common(run)
    run.add_argument("--by", choices=["class"], help="class: every per-request metric per request class "
                                                     "(a workload with classes), printed and written by --out")
    demo = sub.add_parser("demo", help="simulate the built-in example (A10G server, ShareGPT load)")
    demo.add_argument("--show-config", action="store_true", help="print the example's TOML and exit")
    common(demo)

    sw = sub.add_parser("sweep", help="simulate the scenario of a TOML file over a grid of parameter values")
    sw.add_argument("config", type=Path, help="TOML with [engine], [workload], [latency], [slo], [run]")
    sw.add_argument("--grid", action="append", default=[], metavar="PARAM=V1,V2,...",
                    help="a swept parameter and its values, e.g. workload.arrival_rate=1,2,4 "
                         "(repeat for a cartesian product; values parsed as int, float, bool or string)")
    sw.add_argument("--replications", type=int, help="replications per point (overrides [run])")
    sw.add_argument("--seed", type=int, help="random seed (overrides [run])")
    sw.add_argument("--jobs", type=int, default=1,
                    help="worker processes (-1: all cores; default 1: each point already uses every core "
                         "through Numba's threads, and on 2 cores --jobs 2 measured 1.3x slower)")
    sw.add_argument("--out", type=Path, help="write the tidy table here (.parquet, .csv or .json)")
    sw.add_argument("--cache-dir", type=Path, help="cache finished points here (resume an interrupted sweep)")
    sw.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    sw.add_argument("--by", choices=["class"], help="class: --out writes every point's per-class metrics "
                                                    "(a workload with classes)")

    cmp_ = sub.add_parser("compare", help="compare scenarios on common random numbers (paired differences)")
    cmp_.add_argument("configs", type=Path, nargs="+", metavar="CONFIG",
                      help="two or more TOML files; the first is the baseline unless --baseline names another")
    cmp_.add_argument("--baseline", help="name of the baseline scenario (its TOML name, else its file stem)")
    cmp_.add_argument("--metrics", help="comma-separated metrics to show (default: "
                                        + ", ".join(COMPARE_METRICS) + ")")
    cmp_.add_argument("--replications", type=int, help="replications per scenario (overrides [run])")
    cmp_.add_argument("--seed", type=int, help="random seed, common to all scenarios (overrides [run])")
    cmp_.add_argument("--confidence-level", type=float, help="e.g. 0.95 (overrides [run])")
    cmp_.add_argument("--jobs", type=int, default=1, help="worker processes (-1: all cores)")
    cmp_.add_argument("--allow-different-workloads", action="store_true",
                      help="compare scenarios whose workloads differ (streams then only partly common)")
    cmp_.add_argument("--format", choices=["table", "json", "csv"], default="table")
    cmp_.add_argument("--out", type=Path, help="write the tidy comparison here (.csv, .json or .parquet)")
    cmp_.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    cap = sub.add_parser("capacity", help="find the largest arrival rate that meets latency SLOs")
    cap.add_argument("config", type=Path, help="TOML of the scenario (its arrival_rate is the first guess)")
    cap.add_argument("--slo", action="append", default=[], metavar="METRIC=LIMIT",
                     help="an upper limit on a metric's mean, in seconds for latencies, e.g. ttft_p99=0.5 "
                          "(repeat for several)")
    cap.add_argument("--confidence", type=float, default=0.95, help="confidence of each probe's decision")
    cap.add_argument("--rate-bounds", metavar="LOW,HIGH", help="the bracket to search, req/s (default: "
                                                                 "doubled or halved from the scenario's rate)")
    cap.add_argument("--replications", type=int, default=100, help="replications of a probe's first look")
    cap.add_argument("--max-replications", type=int, default=3200, help="cap on a probe's replications")
    cap.add_argument("--tol", type=float, default=0.02, help="relative width of the final bracket")
    cap.add_argument("--seed", type=int, help="random seed (overrides [run])")
    cap.add_argument("--replicas", choices=["auto"], help="auto: the fewest replicas of the scenario's [fleet] "
                                                           "that meet the SLOs at its arrival rate "
                                                           "(fastsim.fleet_capacity)")
    cap.add_argument("--format", choices=["table", "json", "csv"], default="table")
    cap.add_argument("--out", type=Path, help="write the probes here (.csv, .json or .parquet)")

    cal = sub.add_parser("calibrate", help="fit the step-time (latency) model to measurements")
    cal.add_argument("data", type=Path, help="a `vllm bench serve --save-result --save-detailed` JSON, or a "
                                              "decode-step trace JSON (fastsim/data/tpot_traces.json's format)")
    cal.add_argument("--kind", choices=["auto", "bench", "traces"], default="auto",
                     help="the file's kind (auto: by its keys)")
    cal.add_argument("--no-prefill", action="store_true", help="bench files: do not fit the prefill terms")
    cal.add_argument("--out", type=Path, help="write the fitted [latency] table here (.toml), "
                                              "to paste into a scenario")

    cp = sub.add_parser("compile", help="compile the kernels into Numba's cache now (else the first run "
                                        "on a machine does)")
    cp.add_argument("--engine", choices=["both", "common", "full"], default="both",
                    help="common: what most scenarios use; full: for static batching, active priority or swap "
                         "preemption and prefix caching (default: both)")

    pl = sub.add_parser("plot", help="plot a metric of a saved sweep table against a parameter")
    pl.add_argument("table", type=Path, help="a table written by `fastsim sweep --out` (.parquet, .csv, .json)")
    pl.add_argument("--x", required=True, help="parameter on the x axis, e.g. workload.arrival_rate")
    pl.add_argument("--y", required=True, help="metric on the y axis, e.g. ttft_p99")
    pl.add_argument("--hue", help="parameter with one line per value, e.g. engine.max_num_seqs")
    pl.add_argument("--errorbars", action="store_true", help="error bars instead of shaded bands")
    pl.add_argument("--logy", action="store_true", help="logarithmic y axis")
    pl.add_argument("--out", type=Path, default=Path("plot.png"), help="image file (default plot.png)")
    return p


def parse_value(text: str):
    """A grid value from the command line: int, float, bool (true/false) or string."""
    t = text.strip()
    if t.lower() in ("true", "false"):
        return t.lower() == "true"
    if t.lower() in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(t)
        except ValueError:
            pass
    return t


def parse_grid(items) -> dict:
    """``["workload.arrival_rate=1,2,4", ...]`` -> ``{"workload.arrival_rate": [1, 2, 4], ...}``."""
    grid = {}
    if not items:
        raise ValueError("give at least one --grid PARAM=V1,V2,... (e.g. --grid workload.arrival_rate=1,2,4)")
    for item in items:
        key, eq, values = item.partition("=")
        key = key.strip()
        if not eq or not key or not values.strip():
            raise ValueError(f"--grid must look like PARAM=V1,V2,... (e.g. workload.arrival_rate=1,2,4), "
                             f"got {item!r}")
        if key in grid:
            raise ValueError(f"--grid parameter {key!r} given twice")
        parts = [v for v in values.split(",")]
        if any(not v.strip() for v in parts):
            raise ValueError(f"--grid {key}: empty value in {values!r}")
        grid[key] = [parse_value(v) for v in parts]
    return grid


# ------------------------------------------------------------------------------
# Messages, warnings and the scenario file

def _error(msg) -> int:
    print(f"fastsim: error: {msg}", file=sys.stderr)
    return 2


def _warn(msg) -> None:
    print(f"fastsim: warning: {msg}", file=sys.stderr)


def _progress(args):
    """A progress bar only on an interactive terminal, never with --no-progress."""
    return False if args.no_progress else (None if sys.stderr.isatty() else False)


def _load(path: Path):
    """``(scenario, run settings)`` of a scenario file (see :func:`_load_config`)."""
    return _load_config(path)[:2]


def _load_config(path: Path):
    """``(scenario, run settings, raw TOML dict)`` of a scenario file; a ValueError names the table and key."""
    from ._config import Scenario, check_table_keys

    if not path.is_file():
        raise ValueError(f"config must be an existing TOML file, got {str(path)!r}")
    with path.open("rb") as fh:
        try:
            cfg = tomllib.load(fh)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{path} is not valid TOML: {exc}") from None
    run = cfg.get("run", {})
    if not isinstance(run, dict):
        raise ValueError(f"[run] must be a table of key = value settings, got {run!r}")
    run = dict(run)
    check_table_keys("run", run, RUN_KEYS)
    return Scenario.from_dict(cfg, base_dir=path.parent), run, cfg


def inapplicable_metrics(scenario) -> dict:
    """``{metric: why}`` for the metrics this scenario cannot produce (always NaN or 0 by construction)."""
    e, w = scenario.engine, scenario.workload
    out = {}
    if not e.enable_prefix_caching:
        out["prefix_hit_rate"] = "enable_prefix_caching = false"
    elif w.prefix_groups == 0:
        out["prefix_hit_rate"] = "no prefix_groups"
    if e.preemption_mode != "swap":
        out["swaps_per_request"] = f"preemption_mode = {e.preemption_mode!r}"
    if e.max_queue_delay_s is None:
        out["drop_probability"] = "no max_queue_delay_s"
    return out


def scenario_warnings(scenario, cfg: dict | None = None) -> list[str]:
    """What looks like a mistake in a scenario (a TOML file's ``cfg``): an empty
    or default-only scenario, SLOs that look like milliseconds, a metric that cannot apply."""
    from ._config import EngineConfig, Workload
    from ._latency import LatencyModel

    out = []
    if cfg is not None:
        given = [t for t in ("engine", "workload", "latency", "slo") if cfg.get(t)]
        if not given:
            out.append("the file sets no [engine], [workload], [latency] or [slo] value: this runs the built-in "
                       "defaults (see docs/toml-reference.md)")
        elif (scenario.engine == EngineConfig() and repr(scenario.workload) == repr(Workload())
              and scenario.latency == LatencyModel.default() and scenario.ttft_slo_s is None
              and scenario.tpot_slo_s is None):
            out.append("every value in the file is a default: this runs the built-in defaults")
    for key, value, limit in (("ttft_s", scenario.ttft_slo_s, MS_LIKE_S["ttft"]),
                              ("tpot_s", scenario.tpot_slo_s, MS_LIKE_S["tpot"])):
        if value is not None and value >= limit:
            out.append(f"[slo] {key} = {value:g} is in seconds ({value:g} s); if you meant {value:g} ms, "
                       f"write {key} = {value / 1000:g}")
    if scenario.workload.prefix_groups > 0 and not scenario.engine.enable_prefix_caching:
        out.append("[workload] prefix_groups is set but [engine] enable_prefix_caching = false: prefixes are "
                   "not shared and prefix_hit_rate is not measured")
    return out


def _metric_warnings(scenario, metrics, where: str) -> list[str]:
    bad = inapplicable_metrics(scenario)
    return [f"{where} {m}: cannot apply to this scenario ({bad[m]})" for m in metrics if m in bad]


def _ms_like(metric: str, limit: float) -> bool:
    head = metric.split("_")[0]
    return head in MS_LIKE_S and limit >= MS_LIKE_S[head]


def _goodput_slo(scenario) -> str:
    parts = []
    if scenario.ttft_slo_s is not None:
        parts.append(f"TTFT <= {scenario.ttft_slo_s * 1000:g} ms")
    if scenario.tpot_slo_s is not None:
        parts.append(f"TPOT <= {scenario.tpot_slo_s * 1000:g} ms")
    return " and ".join(parts) if parts else "no SLO set: every completed request"


def format_table(summary, scenario=None, result=None, *, n_requested=None) -> str:
    """Human-readable estimates with their confidence intervals.

    With ``scenario``, metrics that cannot apply to it are left out (named in
    a note), metrics that were zero in every replication are listed on one
    line, and goodput shows its SLO.
    """
    lines = []
    if result is not None:
        level = int(round(result.confidence_level * 100))
        title = scenario.name or "scenario"
        arrived = getattr(result, "arrivals", None) or f"{scenario.workload.num_requests}"
        lines.append(f"{title}: {result.n_replications} replications x "
                     f"{arrived} requests "
                     f"({scenario.workload.warmup_requests} warm-up), {result.elapsed_s:.1f} s")
        stab = getattr(result, "stability", None) if getattr(result, "n_replications", 0) else None
        if stab is not None and stab.overloaded:
            lines.append(f"WARNING: {stab.message}")
        if getattr(result, "interrupted", False):
            of = f" of {n_requested}" if n_requested else ""
            lines.append(f"PARTIAL: interrupted after {result.n_replications}{of} replications")
        head = f"{'metric':<26}{'estimate':>13}   {level}% confidence interval"
        if "band_low" in summary:
            head = f"{head:<70}{level}% single-run band"
        lines.append(head)
    skipped = inapplicable_metrics(scenario) if scenario is not None else {}
    zeros = []
    for name, row in summary.iterrows():
        if name in skipped:
            continue
        if scenario is not None and row.estimate == 0 and row.ci_low == 0 and row.ci_high == 0:
            zeros.append(name)
            continue
        unit, scale = metric_unit(name)
        est, lo, hi = row.estimate * scale, row.ci_low * scale, row.ci_high * scale
        extra = f"  ({_goodput_slo(scenario)})" if name == "goodput" and scenario is not None else ""
        line = f"{name:<26}{est:>13.4g}   [{lo:.4g}, {hi:.4g}] {unit}"
        if "band_low" in summary and math.isfinite(row.band_low):
            line = f"{line:<70}[{row.band_low * scale:.4g}, {row.band_high * scale:.4g}] {unit}"
        lines.append(f"{line}{extra}".rstrip())
    if zeros:
        lines.append(f"zero in every replication: {', '.join(zeros)}")
    if skipped:
        lines.append("not applicable here: " + "; ".join(f"{m} ({why})" for m, why in skipped.items()))
    lines.append("Each estimate is the mean over replications of a per-run value (one run = one "
                 "benchmark of num_requests requests); percentiles are per-run percentiles.")
    if "band_low" in summary:
        lines.append("The confidence interval is where the expected value lies (it shrinks with more "
                     "replications); the single-run band is where one benchmark run's value falls.")
    return "\n".join(lines)


# ------------------------------------------------------------------------------
# Compiling, saving, signals

def _warm_up(scenario, backend, quiet: bool) -> float:
    """Compile the kernel ``scenario`` needs or load it from Numba's cache; say
    "compiling" only when it takes long enough to be a compilation. Returns the seconds it took."""
    if backend not in (None, "numba"):
        return 0.0
    from ._replicate import _prepare_kernel

    timer = threading.Timer(1.0, lambda: print(
        f"fastsim: compiling the simulation kernel (one-off, about {COMPILE_S} s; later runs load it from "
        f"Numba's cache, and `fastsim compile` does it ahead of time)...", file=sys.stderr, flush=True))
    timer.daemon = True
    if not quiet:
        timer.start()
    start = time.perf_counter()
    try:
        _prepare_kernel(scenario)
    finally:
        timer.cancel()
    took = time.perf_counter() - start
    if took > 1.0 and not quiet:
        print(f"fastsim: compiled in {took:.0f} s", file=sys.stderr)
    return took


def _save(write, path: Path, flag: str) -> bool:
    """``write(path)``; if that fails, write next to the temporary directory
    instead and say where (results are never lost to a failing write)."""
    try:
        write(path)
        return True
    except OSError as exc:
        fd, alt = tempfile.mkstemp(prefix="fastsim-", suffix=path.suffix or ".csv")
        os.close(fd)
        try:
            write(Path(alt))
            where = f"written to {alt} instead"
        except OSError as exc2:
            where = f"and the fallback {alt} failed too ({exc2})"
        print(f"fastsim: error: {flag} {path}: {exc.strerror or exc}; {where}", file=sys.stderr)
        return False


class _Signals:
    """SIGTERM as KeyboardInterrupt (both then keep the finished part); a second
    signal, a second or more after the first, quits at once. ``code``: the exit
    status for the signal received."""

    #: A repeat within this many seconds is the same request delivered twice
    #: (`timeout` and process managers signal the child and its process group).
    REPEAT_S = 1.0

    def __init__(self):
        self.code = EXIT_INTERRUPTED
        self.stopping = None   # time of the first signal
        self._old = {}

    def _handler(self, signum, frame):
        code = EXIT_TERMINATED if signum == signal.SIGTERM else EXIT_INTERRUPTED
        now = time.monotonic()
        if self.stopping is not None:
            if now - self.stopping < self.REPEAT_S:
                return
            for stream in (sys.stdout, sys.stderr):   # asked again: do not wait for the running chunks
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
            os._exit(self.code)
        self.stopping = now
        self.code = code
        raise KeyboardInterrupt

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        return False


def _interrupted_note(what: str) -> None:
    print(f"fastsim: interrupted; {what}", file=sys.stderr)


# ------------------------------------------------------------------------------
# Subcommands

def _run_main(args, sig) -> int:
    from ._replicate import Interrupted, replicate

    try:
        scenario, run, cfg = _load_config(EXAMPLE if args.command == "demo" else args.config)
        kwargs = {"n_replications": run.get("n_replications", 1000), "seed": run.get("seed"),
                  "confidence_level": run.get("confidence_level", 0.95)}
        for key in ("precision", "max_replications", "n_threads"):
            if key in run:
                kwargs[key] = run[key]
        for flag, key in (("replications", "n_replications"), ("seed", "seed"),
                          ("confidence_level", "confidence_level"), ("threads", "n_threads"),
                          ("backend", "backend")):
            if getattr(args, flag) is not None:
                kwargs[key] = getattr(args, flag)
        for path, flag in ((args.out, "--out"), (args.per_replication, "--per-replication")):
            if path is not None:
                check_table_path(path, flag, writing=True)
        warnings_ = scenario_warnings(scenario, None if args.command == "demo" else cfg)
        if isinstance(kwargs.get("precision"), dict):
            warnings_ += _metric_warnings(scenario, kwargs["precision"], "[run] precision")
        for w in warnings_:
            _warn(w)
        quiet = args.no_progress or args.format != "table"
        compile_s = _warm_up(scenario, kwargs.get("backend"), quiet)
        if not quiet:
            print(f"fastsim: running {kwargs['n_replications']} replications x about "
                  f"{scenario.workload.mean_arrivals:.0f} requests (Ctrl-C stops and keeps the finished ones)",
                  file=sys.stderr, flush=True)
        start = time.perf_counter()
        try:
            result = replicate(scenario, progress=_progress(args), **kwargs)
        except Interrupted as stop:
            result = stop.partial
    except (ValueError, BackendUnavailableError) as exc:
        return _error(exc)
    partial = result.interrupted
    if partial:
        _interrupted_note(f"kept the {result.n_replications} finished replications (of "
                          f"{kwargs['n_replications']}{' or more' if 'precision' in kwargs else ''})")
    if result.n_replications == 0:
        return sig.code
    by = getattr(args, "by", None)
    try:
        summary = result.summary(by=by)
    except ValueError as exc:
        return _error(exc)
    if partial:
        summary["partial"] = True
    if by is not None and args.format == "table":
        print(summary.drop(columns=["partial", "description"], errors="ignore").to_string(index=False))
    elif args.format == "table":
        print(format_table(summary.drop(columns="partial", errors="ignore"), scenario, result,
                          n_requested=kwargs["n_replications"]))
        took = f"{time.perf_counter() - start:.1f} s"
        if compile_s > 1.0:
            took += f", after {compile_s:.0f} s of one-off compilation"
        if not args.no_progress:
            print(f"(wall time {took})", file=sys.stderr)
    elif args.format == "json":
        print(summary.reset_index().to_json(orient="records", indent=2))
    else:
        print(summary.to_csv(), end="")
    ok = True
    if args.out is not None:
        ok &= _save(result.save if by is None else (lambda p: result.save(p, by=by)), args.out, "--out")
    if args.per_replication is not None:
        per = result.per_replication.copy()
        if partial:
            per["partial"] = True
        ok &= _save(lambda p: save_table(per, p, "--per-replication"), args.per_replication, "--per-replication")
    if partial:
        return sig.code
    return 0 if ok else 1


def _sweep_main(args, sig) -> int:
    from ._replicate import Interrupted

    try:
        scenario, run, cfg = _load_config(args.config)
        grid = parse_grid(args.grid)
        if args.out is not None:
            check_table_path(args.out, "--out", writing=True)
        unused = sorted(set(run) & {"precision", "max_replications"})
        if unused:
            raise ValueError(f"[run] {', '.join(unused)}: not used by sweep (every point runs n_replications "
                             f"replications); remove them, or use `fastsim run` per point")
        if "n_threads" in run:
            print("fastsim: note: [run] n_threads is not used by sweep (--jobs sets its parallelism)",
                  file=sys.stderr)
        for w in scenario_warnings(scenario, cfg):
            _warn(w)
        n = args.replications if args.replications is not None else run.get("n_replications", 1000)
        seed = args.seed if args.seed is not None else run.get("seed")
        from ._sweep import sweep

        if not args.no_progress:
            print(f"fastsim: sweeping {math.prod(len(v) for v in grid.values())} points x {n} replications "
                  f"(Ctrl-C stops and keeps the finished points)", file=sys.stderr, flush=True)
        try:
            result = sweep(scenario, grid, n_replications=n, seed=seed, n_jobs=args.jobs,
                           confidence_level=run.get("confidence_level", 0.95), cache_dir=args.cache_dir,
                           progress=_progress(args))
        except Interrupted as stop:
            result = stop.partial
    except ValueError as exc:
        return _error(exc)
    if result.interrupted:
        _interrupted_note(f"kept the {result.n_points} finished points")
        if result.n_points == 0:
            return sig.code
    frame = result.frame
    level = int(round(result.confidence_level * 100))
    shown = frame[frame["metric"].isin(["ttft_p99", "tpot_mean", "request_throughput", "goodput"])]
    print(f"{scenario.name or 'scenario'}: {result.n_points} points x {n} replications x "
          f"about {scenario.workload.mean_arrivals:.0f} requests, seed {result.seed}, {result.elapsed_s:.1f} s "
          f"({sum(result.cached)} points from the cache)")
    if result.interrupted:
        print("PARTIAL: interrupted; only the finished points are shown")
    print(f"estimates with {level}% confidence intervals (all metrics: --out FILE); goodput: "
          f"{_goodput_slo(scenario)}")
    params = result.parameters
    for point, rows in shown.groupby("point", sort=True):
        head = ", ".join(f"{p.split('.')[-1]}={rows[p].iloc[0]}" for p in params)
        cells = []
        for _, row in rows.iterrows():
            unit, scale = metric_unit(row.metric)
            cells.append(f"{row.metric} {row.estimate * scale:.4g} [{row.ci_low * scale:.4g}, "
                         f"{row.ci_high * scale:.4g}] {unit}".rstrip())
        print(f"  {head}: " + "; ".join(cells))
    ok = True
    if args.out is not None:
        by = args.by
        if by is not None:
            try:
                result.summary(by=by)
            except ValueError as exc:
                return _error(exc)
        ok = _save(lambda p: result.save(p, by=by), args.out, "--out")
        if ok:
            print(f"wrote {args.out}", file=sys.stderr)
    if result.interrupted:
        return sig.code
    return 0 if ok else 1


def _names(paths, scenarios) -> list[str]:
    names = []
    for path, sc in zip(paths, scenarios):
        name = sc.name or path.stem
        base, k = name, 2
        while name in names:
            name, k = f"{base} ({k})", k + 1
        names.append(name)
    return names


def _compare_main(args, sig) -> int:
    from ._compare import compare
    from . import kernel as K

    try:
        if len(args.configs) < 2:
            raise ValueError(f"compare needs two or more TOML files, got {len(args.configs)}")
        loaded = [_load_config(p) for p in args.configs]
        scenarios = [sc for sc, _, _ in loaded]
        names = _names(args.configs, scenarios)
        run = loaded[0][1]
        if args.baseline is not None and args.baseline not in names:
            raise ValueError(f"--baseline must be one of {', '.join(map(repr, names))}, got {args.baseline!r}")
        metrics = None
        if args.metrics:
            metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
            bad = [m for m in metrics if m not in K.METRICS]
            if bad:
                raise ValueError(f"--metrics: unknown metric(s) {bad}; allowed: {', '.join(K.METRICS)}")
        if args.out is not None:
            check_table_path(args.out, "--out", writing=True)
        for name, (sc, _, cfg) in zip(names, loaded):
            for w in scenario_warnings(sc, cfg) + _metric_warnings(sc, metrics or (), "--metrics"):
                _warn(f"{name}: {w}")
        n = args.replications if args.replications is not None else run.get("n_replications", 1000)
        seed = args.seed if args.seed is not None else run.get("seed")
        level = (args.confidence_level if args.confidence_level is not None
                 else run.get("confidence_level", 0.95))
        for sc in scenarios:
            _warm_up(sc, None, args.no_progress or args.format != "table")
        result = compare(dict(zip(names, scenarios)), n_replications=n, seed=seed, baseline=args.baseline,
                         confidence_level=level, allow_different_workloads=args.allow_different_workloads,
                         n_jobs=args.jobs, progress=_progress(args))
    except ValueError as exc:
        return _error(exc)
    frame = result.frame
    if metrics is None:
        skip = set.intersection(*(set(inapplicable_metrics(sc)) for sc in scenarios))
        shown = frame[frame["metric"].isin(COMPARE_METRICS) & ~frame["metric"].isin(skip)]
    else:
        shown = frame[frame["metric"].isin(metrics)]
    if args.format == "json":
        print(shown.to_json(orient="records", indent=2))
    elif args.format == "csv":
        print(shown.to_csv(index=False), end="")
    else:
        pct = int(round(result.confidence_level * 100))
        print(f"{len(names)} scenarios x {n} replications on common random numbers, seed {result.seed}, "
              f"{result.elapsed_s:.1f} s; baseline: {result.baseline}")
        print(f"{'scenario':<20}{'metric':<24}{'baseline':>11}{'scenario':>11}{'difference':>12}   "
              f"{pct}% CI of the difference")
        for row in shown.itertuples():
            unit, scale = metric_unit(row.metric)
            sig_mark = " *" if row.significant else ""
            print(f"{str(row.scenario)[:19]:<20}{row.metric:<24}{row.baseline_estimate * scale:>11.4g}"
                  f"{row.estimate * scale:>11.4g}{row.difference * scale:>+12.4g}   "
                  f"[{row.ci_low * scale:+.4g}, {row.ci_high * scale:+.4g}] {unit}{sig_mark}")
        print("* the interval excludes 0. goodput: " + "; ".join(
            f"{nm}: {_goodput_slo(sc)}" for nm, sc in zip(names, scenarios)))
    if args.out is not None and not _save(result.save, args.out, "--out"):
        return 1
    return 0


def parse_slos(items) -> dict:
    """``["ttft_p99=0.5", ...]`` -> ``{"ttft_p99": 0.5, ...}``."""
    if not items:
        raise ValueError("give at least one --slo METRIC=LIMIT (seconds for latencies), e.g. --slo ttft_p99=0.5")
    slo = {}
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip()
        try:
            limit = float(value)
        except ValueError:
            limit = None
        if not eq or not key or limit is None:
            raise ValueError(f"--slo must look like METRIC=LIMIT (e.g. ttft_p99=0.5), got {item!r}")
        if key in slo:
            raise ValueError(f"--slo {key!r} given twice")
        slo[key] = limit
    return slo


def _capacity_main(args, sig) -> int:
    from ._capacity import capacity

    try:
        scenario, run, cfg = _load_config(args.config)
        slo = parse_slos(args.slo)
        bounds = None
        if args.rate_bounds:
            try:
                bounds = tuple(float(v) for v in args.rate_bounds.split(","))
            except ValueError:
                bounds = ()
            if len(bounds) != 2:
                raise ValueError(f"--rate-bounds must look like LOW,HIGH (req/s), got {args.rate_bounds!r}")
        if args.out is not None:
            check_table_path(args.out, "--out", writing=True)
        for w in scenario_warnings(scenario, cfg) + _metric_warnings(scenario, slo, "--slo"):
            _warn(w)
        for m, limit in slo.items():
            if _ms_like(m, limit):
                _warn(f"--slo {m}={limit:g} is in seconds; if you meant {limit:g} ms, write {m}={limit / 1000:g}")
        seed = args.seed if args.seed is not None else run.get("seed")
        # ([run] is `fastsim run`'s: a probe's replications and confidence are capacity's own flags)
        unused = [k for k in ("n_replications", "confidence_level", "max_replications", "precision", "n_threads")
                  if k in run]
        if unused:
            print(f"fastsim: note: [run] {', '.join(unused)} not used by capacity (its flags --replications, "
                  f"--max-replications and --confidence set a probe's; it runs on Numba's threads)", file=sys.stderr)
        if args.replicas == "auto":
            return _fleet_capacity_main(args, scenario, slo, seed)
        _warm_up(scenario, None, args.format != "table")
        result = capacity(scenario, slo, confidence=args.confidence, rate_bounds=bounds,
                          n_replications=args.replications, seed=seed, tol=args.tol,
                          max_replications=args.max_replications)
    except ValueError as exc:
        return _error(exc)
    summary = result.summary()
    if args.format == "json":
        print(json.dumps({"rate": _num(result.rate), "rate_interval": [_num(v) for v in result.rate_interval],
                          "slo": result.slo, "confidence": result.confidence,
                          "goodput_rate": _num(result.goodput_rate), "goodput": _num(result.goodput),
                          "total_replications": result.total_replications,
                          "probes": json.loads(summary.to_json(orient="records"))}, indent=2))
    elif args.format == "csv":
        print(summary.to_csv(index=False), end="")
    else:
        lo, hi = result.rate_interval
        limits = ", ".join(f"{m} <= {v:g}" for m, v in result.slo.items())
        print(f"{scenario.name or 'scenario'}: capacity under {limits} (each probe decided at "
              f"{result.confidence:.0%} confidence), {result.elapsed_s:.1f} s, "
              f"{result.total_replications} replications")
        if math.isnan(result.rate):
            print("no probed rate was proven to meet the SLO (lower --rate-bounds?)")
        else:
            print(f"largest rate proven to meet it: {result.rate:.4g} req/s (the limit lies in "
                  f"[{lo:.4g}, {hi:.4g}] req/s)")
        print(f"highest goodput among the probes: {result.goodput:.4g} req/s at {result.goodput_rate:.4g} req/s "
              f"({_goodput_slo(scenario)})")
        with_cols = ["rate", "decision", "replications"] + [c for c in summary.columns if c.endswith("_estimate")]
        print(summary[with_cols].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if args.out is not None and not _save(lambda p: save_table(result.probes, p, "--out"), args.out, "--out"):
        return 1
    return 0


def _fleet_capacity_main(args, scenario, slo, seed) -> int:
    """``fastsim capacity CONFIG.toml --replicas auto``: the fewest replicas."""
    from ._fleet_capacity import fleet_capacity

    if scenario.fleet is None:
        raise ValueError("--replicas auto needs a [fleet] table in the scenario (its router; e.g. "
                         "[fleet] router = \"jsq\"), got none")
    if args.rate_bounds:
        raise ValueError("--rate-bounds is not used with --replicas auto (the rate is the scenario's)")
    result = fleet_capacity(scenario, slo, confidence=args.confidence, n_replications=args.replications,
                            seed=seed, max_replications=args.max_replications)
    summary = result.summary()
    if args.format == "json":
        print(summary.to_json(orient="records", indent=2))
    elif args.format == "csv":
        print(summary.to_csv(index=False), end="")
    else:
        limits = ", ".join(f"{m} <= {v:g}" for m, v in result.slo.items())
        rate = scenario.workload.arrival_rate
        print(f"{scenario.name or 'scenario'}: replicas behind router {scenario.fleet.router!r} at {rate:g} "
              f"req/s under {limits} (each probe decided at {result.confidence:.0%} confidence), "
              f"{result.total_replications} replications")
        if result.replicas is None:
            print("no fleet size probed was proven to meet the SLOs")
        else:
            lo, hi = result.replicas_interval
            cost = "" if result.cost_per_hour is None else f", {result.cost_per_hour:.4g} per hour"
            print(f"fewest replicas proven to meet them: {result.replicas} (the answer lies in [{lo}, {hi}]{cost})")
        print(summary.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if args.out is not None and not _save(lambda p: save_table(result.probes, p, "--out"), args.out, "--out"):
        return 1
    return 0


def _num(v):
    v = float(v)
    return v if math.isfinite(v) else None


def calibrate_file(path: Path, kind: str = "auto", *, fit_prefill: bool = True):
    """The :class:`~fastsim._calibration.CalibrationResult` of a measurement file.

    The one place the CLI reaches the calibration code (``kind``: ``"bench"``
    for ``vllm bench serve`` results, ``"traces"`` for decode-step traces,
    ``"auto"`` by the file's keys), so that it can follow that code's API.
    """
    from . import _calibration
    from ._latency import LatencyModel

    if not path.is_file():
        raise ValueError(f"data must be an existing JSON file, got {str(path)!r}")
    if kind == "auto":
        try:
            with path.open(encoding="utf-8") as fh:
                data = json.load(fh)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path} is not valid JSON: {exc}") from None
        if isinstance(data, dict) and "measurements" in data:
            kind = "traces"
        elif isinstance(data, dict) and "ttfts" in data and "itls" in data:
            kind = "bench"
        else:
            keys = sorted(data)[:12] if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"{path}: neither a `vllm bench serve --save-result --save-detailed` file (keys "
                             f"ttfts, itls, input_lens, output_lens) nor a decode-step trace file (key "
                             f"measurements); its keys: {keys}. Use --kind to say which")
    if kind == "bench":
        return _calibration.fit_bench_serve(path, fit_prefill=fit_prefill)
    return LatencyModel.from_tpot_traces(path).calibration


def latency_toml(model) -> str:
    """A ``[latency]`` table for a scenario file that gives ``model``."""
    keys = ("base_s", "decode_scale_s", "decode_alpha", "prefill_per_token_s", "ctx_per_token_s",
            "ttft_overhead_s", "swap_s_per_block")
    return "[latency]\n" + "".join(f"{k} = {float(getattr(model, k))!r}\n" for k in keys)


def _calibrate_main(args, sig) -> int:
    try:
        if args.out is not None:
            if args.out.suffix.lower() != ".toml":
                raise ValueError(f"--out must end in .toml, got {str(args.out)!r}")
            check_output_dir(args.out, "--out")
        fit = calibrate_file(args.data, args.kind, fit_prefill=not args.no_prefill)
        table = latency_toml(fit.latency_model())
    except ValueError as exc:
        return _error(exc)
    print(fit.report())
    print()
    print(f"# fitted by `fastsim calibrate {args.data.name}`; paste into a scenario file")
    print(table, end="")
    if args.out is not None:
        header = f"# fitted by `fastsim calibrate {args.data.name}` ({fit.method})\n"
        if not _save(lambda p: p.write_text(header + table), args.out, "--out"):
            return 1
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


def _plot_main(args, sig) -> int:
    try:
        if args.out.suffix.lower() not in (".png", ".pdf", ".svg", ".jpg", ".jpeg"):
            raise ValueError(f"--out must end in .png, .pdf, .svg or .jpg, got {str(args.out)!r}")
        check_output_dir(args.out, "--out")
        frame = read_table(args.table)
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from ._plot import plot_sweep

        ax = plot_sweep(frame, args.x, args.y, hue=args.hue, band=not args.errorbars, logy=args.logy)
    except ValueError as exc:
        return _error(exc)
    fig = ax.figure
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    plt.close(fig)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def _compile_main(args, sig) -> int:
    import numba

    from ._replicate import compile_kernels

    print("compiling the kernels, or loading them from Numba's cache...", file=sys.stderr)
    for row in compile_kernels(args.engine).itertuples():
        print(f"{row.engine} engine: ready in {row.seconds:.1f} s")
    where = numba.config.CACHE_DIR or "__pycache__ next to the fastsim package (NUMBA_CACHE_DIR moves it)"
    print(f"Numba's cache: {where}")
    return 0


_COMMANDS = {"run": _run_main, "demo": _run_main, "sweep": _sweep_main, "compare": _compare_main,
             "capacity": _capacity_main, "calibrate": _calibrate_main, "plot": _plot_main,
             "compile": _compile_main}


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "demo" and args.show_config:
        print(EXAMPLE.read_text(), end="")   # the file, byte for byte (`> my.toml`)
        return 0
    sig = _Signals()
    try:
        with sig:
            return _COMMANDS[args.command](args, sig)
    except KeyboardInterrupt:
        # interrupted where nothing was finished to keep (loading, compiling, capacity, compare)
        _interrupted_note("nothing finished to keep")
        return sig.code
    except BrokenPipeError:
        # `fastsim ... | head`: the reader left; say nothing more, and keep
        # Python from complaining when it flushes stdout at exit.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 128 + signal.SIGPIPE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
