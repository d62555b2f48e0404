"""Command line: ``fastsim demo``, ``fastsim run CONFIG.toml``, ``fastsim sweep``, ``fastsim plot`` and
``fastsim compile``."""

from __future__ import annotations

import argparse
import sys
import time
import tomllib
from pathlib import Path

from ._cuda import BackendUnavailableError
from ._io import check_output_dir, check_table_path, read_table, save_table
from ._replicate import metric_unit

EXAMPLE = Path(__file__).parent / "examples" / "a10g_sharegpt.toml"
RUN_KEYS = {"n_replications", "seed", "confidence_level", "precision", "max_replications", "n_threads"}


def _parser():
    p = argparse.ArgumentParser(prog="fastsim", description="Simulate an LLM inference server with confidence.")
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
        sp.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    run = sub.add_parser("run", help="simulate the scenario of a TOML file")
    run.add_argument("config", type=Path, help="TOML with [engine], [workload], [latency], [slo], [run]")
    common(run)
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
    sw.add_argument("--jobs", type=int, default=1, help="worker processes (-1: all cores)")
    sw.add_argument("--out", type=Path, help="write the tidy table here (.parquet, .csv or .json)")
    sw.add_argument("--cache-dir", type=Path, help="cache finished points here (resume an interrupted sweep)")
    sw.add_argument("--no-progress", action="store_true", help="hide the progress bar")

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


def _progress(args):
    """A progress bar only on an interactive terminal, never with --no-progress."""
    return False if args.no_progress else (None if sys.stderr.isatty() else False)


def _sweep_main(args) -> int:
    try:
        scenario, run = _load(args.config)
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
        n = args.replications if args.replications is not None else run.get("n_replications", 1000)
        seed = args.seed if args.seed is not None else run.get("seed")
        from ._sweep import sweep

        progress = _progress(args)
        result = sweep(scenario, grid, n_replications=n, seed=seed, n_jobs=args.jobs,
                       confidence_level=run.get("confidence_level", 0.95), cache_dir=args.cache_dir,
                       progress=progress)
    except ValueError as exc:
        print(f"fastsim: error: {exc}", file=sys.stderr)
        return 2
    frame = result.frame
    level = int(round(result.confidence_level * 100))
    shown = frame[frame["metric"].isin(["ttft_p99", "tpot_mean", "request_throughput", "goodput"])]
    print(f"{scenario.name or 'scenario'}: {result.n_points} points x {n} replications x "
          f"{scenario.workload.num_requests} requests, seed {result.seed}, {result.elapsed_s:.1f} s "
          f"({sum(result.cached)} points from the cache)")
    print(f"estimates with {level}% confidence intervals (all metrics: --out FILE)")
    params = result.parameters
    for point, rows in shown.groupby("point", sort=True):
        head = ", ".join(f"{p.split('.')[-1]}={rows[p].iloc[0]}" for p in params)
        cells = []
        for _, row in rows.iterrows():
            unit, scale = metric_unit(row.metric)
            cells.append(f"{row.metric} {row.estimate * scale:.4g} [{row.ci_low * scale:.4g}, "
                         f"{row.ci_high * scale:.4g}] {unit}".rstrip())
        print(f"  {head}: " + "; ".join(cells))
    if args.out is not None:
        result.save(args.out)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


def _plot_main(args) -> int:
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
        print(f"fastsim: error: {exc}", file=sys.stderr)
        return 2
    fig = ax.figure
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    plt.close(fig)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def _load(path: Path):
    from ._config import Scenario

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
    unknown = set(run) - RUN_KEYS
    if unknown:
        raise ValueError(f"[run]: unknown key(s) {sorted(unknown)}; allowed: {sorted(RUN_KEYS)}")
    return Scenario.from_dict(cfg, base_dir=path.parent), run


def format_table(summary, scenario=None, result=None) -> str:
    """Human-readable estimates with their confidence intervals."""
    lines = []
    if result is not None:
        level = int(round(result.confidence_level * 100))
        title = scenario.name or "scenario"
        lines.append(f"{title}: {result.n_replications} replications x "
                     f"{scenario.workload.num_requests} requests "
                     f"({scenario.workload.warmup_requests} warm-up), {result.elapsed_s:.1f} s")
        lines.append(f"{'metric':<26}{'estimate':>13}   {level}% confidence interval")
    for name, row in summary.iterrows():
        unit, scale = metric_unit(name)
        est, lo, hi = row.estimate * scale, row.ci_low * scale, row.ci_high * scale
        lines.append(f"{name:<26}{est:>13.4g}   [{lo:.4g}, {hi:.4g}] {unit}")
    lines.append("Each estimate is the mean over replications of a per-run value (one run = one "
                 "benchmark of num_requests requests); percentiles are per-run percentiles.")
    return "\n".join(lines)


def _compile_main(args) -> int:
    import numba

    from ._replicate import compile_kernels

    print("compiling the kernels, or loading them from Numba's cache...", file=sys.stderr)
    for row in compile_kernels(args.engine).itertuples():
        print(f"{row.engine} engine: ready in {row.seconds:.1f} s")
    where = numba.config.CACHE_DIR or "__pycache__ next to the fastsim package (NUMBA_CACHE_DIR moves it)"
    print(f"Numba's cache: {where}")
    return 0


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "sweep":
        return _sweep_main(args)
    if args.command == "plot":
        return _plot_main(args)
    if args.command == "compile":
        return _compile_main(args)
    if args.command == "demo" and args.show_config:
        print(EXAMPLE.read_text(), end="")   # the file, byte for byte (`> my.toml`)
        return 0
    try:
        scenario, run = _load(EXAMPLE if args.command == "demo" else args.config)
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
        from ._replicate import replicate

        if args.format == "table" and not args.no_progress:
            print("compiling and running (the first run on a machine compiles the kernel)...",
                  file=sys.stderr)
        start = time.perf_counter()
        progress = _progress(args)
        result = replicate(scenario, progress=progress, **kwargs)
    except (ValueError, BackendUnavailableError) as exc:
        print(f"fastsim: error: {exc}", file=sys.stderr)
        return 2
    summary = result.summary()
    if args.format == "table":
        print(format_table(summary, scenario, result))
        print(f"(wall time including compilation: {time.perf_counter() - start:.1f} s)", file=sys.stderr)
    elif args.format == "json":
        print(summary.reset_index().to_json(orient="records", indent=2))
    else:
        print(summary.to_csv(), end="")
    if args.out is not None:
        result.save(args.out)
    if args.per_replication is not None:
        save_table(result.per_replication, args.per_replication, "--per-replication")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
