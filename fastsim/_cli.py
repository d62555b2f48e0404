"""Command line: ``fastsim demo`` and ``fastsim run CONFIG.toml``."""

from __future__ import annotations

import argparse
import sys
import time
import tomllib
from pathlib import Path

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
        sp.add_argument("--backend", choices=["numba", "reference"], default=None)
        sp.add_argument("--format", choices=["table", "json", "csv"], default="table")
        sp.add_argument("--out", type=Path, help="also write the summary here (.csv, .json or .parquet)")
        sp.add_argument("--per-replication", type=Path,
                        help="write the per-replication table here (.csv or .parquet)")
        sp.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    run = sub.add_parser("run", help="simulate the scenario of a TOML file")
    run.add_argument("config", type=Path, help="TOML with [engine], [workload], [latency], [slo], [run]")
    common(run)
    demo = sub.add_parser("demo", help="simulate the built-in example (A10G server, ShareGPT load)")
    demo.add_argument("--show-config", action="store_true", help="print the example's TOML and exit")
    common(demo)
    return p


def _load(path: Path):
    from ._config import Scenario

    if not path.is_file():
        raise ValueError(f"config must be an existing TOML file, got {str(path)!r}")
    with path.open("rb") as fh:
        try:
            cfg = tomllib.load(fh)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{path} is not valid TOML: {exc}") from None
    run = dict(cfg.get("run", {}))
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
        unit, scale = _unit(name)
        est, lo, hi = row.estimate * scale, row.ci_low * scale, row.ci_high * scale
        lines.append(f"{name:<26}{est:>13.4g}   [{lo:.4g}, {hi:.4g}] {unit}")
    lines.append("Each estimate is the mean over replications of a per-run value (one run = one "
                 "benchmark of num_requests requests); percentiles are per-run percentiles.")
    return "\n".join(lines)


def _unit(metric):
    if metric.startswith(("ttft", "tpot", "itl", "e2e")):
        return "ms", 1000.0
    if metric in ("request_throughput", "goodput"):
        return "req/s", 1.0
    if metric == "output_throughput":
        return "tok/s", 1.0
    return "", 1.0


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "demo" and args.show_config:
        print(EXAMPLE.read_text())
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
        if args.out is not None and args.out.suffix.lower() not in (".csv", ".json", ".parquet"):
            raise ValueError(f"--out must end in .csv, .json or .parquet, got {str(args.out)!r}")
        from ._replicate import replicate

        if args.format == "table" and not args.no_progress:
            print("compiling and running (the first run on a machine compiles the kernel)...",
                  file=sys.stderr)
        start = time.perf_counter()
        progress = False if args.no_progress else (None if sys.stderr.isatty() else False)
        result = replicate(scenario, progress=progress, **kwargs)
    except ValueError as exc:
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
        if args.per_replication.suffix.lower() == ".parquet":
            result.per_replication.to_parquet(args.per_replication)
        else:
            result.per_replication.to_csv(args.per_replication)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
