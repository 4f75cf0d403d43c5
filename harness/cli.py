"""The ``growbench`` command line.

``list``, ``run``, ``train``, ``export``, ``report``, ``recommend``, ``targets``, ``example``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import strategies


def _csv(kind):
    """An argparse type for comma-separated lists of ``kind``."""

    def parse(text: str) -> list:
        try:
            return [kind(x) for x in text.split(",") if x.strip()]
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__}s, got {text!r}") from e

    return parse


def _datasets() -> dict[str, str]:
    from datasets import DATASETS

    return {name: cls.description for name, cls in DATASETS.items()}


def _cmd_list(args: argparse.Namespace) -> int:
    from .sweep import sweep_presets

    sweeps = {name: [{k: v for k, v in g.items() if k != "strategies"} | {"n_strategies": len(g["strategies"])}
                     for g in grids] for name, grids in sweep_presets().items()}
    from .train_sweep import train_presets

    data = {"presets": strategies.presets(), "strategies": strategies.specs(), "datasets": _datasets(),
            "sweep_presets": sweeps,
            "train_presets": {name: [c.as_dict() for c in cs] for name, cs in train_presets().items()}}
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print("strategy presets:")
    for name, spec in data["presets"].items():
        print(f"  {name:10s} {spec}")
    print(f"strategies: {len(data['strategies'])} specs, averaging/inverse/truncation[+metric]/line_search:method")
    print("datasets:")
    for name, desc in data["datasets"].items():
        print(f"  {name:15s} {desc}")
    print("sweep presets:")
    for name, grids in sweeps.items():
        n = sum(1 for _ in _iter_configs(name))
        print(f"  {name:6s} {n} runs in {len(grids)} grid(s)")
    print("training presets (growbench train):")
    for name, configs in data["train_presets"].items():
        print(f"  {name:6s} {len(configs)} runs")
    return 0


def _iter_configs(preset: str):
    from .sweep import expand, sweep_presets

    return expand(sweep_presets()[preset])


def _grids(args: argparse.Namespace) -> list[dict]:
    from .sweep import DATASET_NAMES, sweep_presets

    presets = sweep_presets()
    if args.preset:
        if args.preset not in presets:
            raise ValueError(f"unknown sweep preset {args.preset!r}; valid: {', '.join(presets)}")
        grids = [dict(g) for g in presets[args.preset]]
    else:
        grids = [dict(strategies=["default"], datasets=list(DATASET_NAMES), d_s=[16], d_e=[32], b=[64], d_k=[4],
                      p=[4], seeds=[0], devices=["cpu"])]
    overrides = {k: getattr(args, k) for k in ("strategies", "datasets", "d_s", "d_e", "b", "d_k", "p", "seeds",
                                               "devices", "n_batches", "repeats", "warmup_steps")}
    for g in grids:
        g.update({k: v for k, v in overrides.items() if v is not None})
    return grids


def _cmd_run(args: argparse.Namespace) -> int:
    import pandas as pd

    from .db import ResultsDB
    from .sweep import expand, preset_summary, run_sweep, summary

    configs = expand(_grids(args))
    ResultsDB(args.db).close()  # check, create and mark the file before a word is printed or a run measured
    print(f"{len(configs)} runs -> {args.db}", file=sys.stderr)
    frame = run_sweep(configs, args.db, jobs=args.jobs, backend=args.backend, scheduler=args.scheduler,
                      resume=args.resume, retry_failed=args.retry_failed,
                      cache_dir=None if args.no_cache else args.cache_dir, progress=not args.no_progress)
    table = summary(frame)
    if len(table) > 40:
        print(f"{len(table)} strategy × dataset lines; the presets follow (growbench export for everything)")
        table = preset_summary(frame)
    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.max_rows", 200,
                           "display.max_colwidth", 42):
        print(table.to_string(index=False, float_format=lambda x: f"{x:.4g}") if len(table) else "no results")
    n_failed = int((frame.status != "ok").sum()) if len(frame) else 0
    if n_failed:
        from .recommend import first_error

        first = frame[frame.status != "ok"].iloc[0]
        print(f"{n_failed} failed runs recorded (first: {first.strategy} on {first.dataset}: "
              f"{first_error(pd.Series([first.error]))})", file=sys.stderr)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from .db import read_runs
    from .dbfile import check_output_file

    if not Path(args.db).exists():
        raise ValueError(f"no results database at {args.db}: run 'growbench run' first")
    out = args.out or str(Path(args.db).with_suffix("." + args.format))
    check_output_file(out)  # before reading: a bad --out is the user's to fix first
    frame = read_runs(args.db)  # read only: exporting never changes the database
    try:
        if args.format == "csv":
            frame.to_csv(out, index=False)
        else:
            frame.to_parquet(out, index=False)
    except OSError as e:
        raise ValueError(f"{out}: cannot write the export: {e.strerror or e}") from e
    print(f"{len(frame)} runs -> {out}")
    return 0


def _cmd_example(args: argparse.Namespace) -> int:
    import pandas as pd

    from .example import run_example

    names = args.presets.split(",") if args.presets else None
    for n in names or []:
        strategies.parse(n)  # unknown names fail before any work, with the valid list
    df = run_example(b=args.b, d_s=args.d_s, d_e=args.d_e, d_k=args.d_k, p=args.p, cond=args.cond,
                     repeats=args.repeats, seed=args.seed, device=args.device, names=names)
    print("problem:", ", ".join(f"{k}={v}" for k, v in df.attrs["problem"].items()))
    print(f"bottleneck ‖ΠG‖/‖G‖ = {df.attrs['bottleneck']:.4f}")
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_colwidth", 60):
        print(df.drop(columns=["fallback"]).to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    for _, row in df[df.fallback != ""].iterrows():
        print(f"fallback in {row.preset}: {row.fallback}")
    if args.json:
        df.to_json(args.json, orient="records", indent=2)
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from .dbfile import check_output_dir
    from .report import build_report

    check_output_dir(args.out)  # before any work: an existing file or a read-only folder is refused in one line
    done = build_report(args.db, args.out, svg=not args.no_svg, device=args.device)
    print(f"report of {args.db} -> {Path(args.out) / 'report.html'} ({len(done['files'])} files; figures: "
          f"{', '.join(done['figures']) or 'none'})")
    for note in done["notes"]:
        print(f"  no figure: {note}")
    return 0


def _cmd_recommend(args: argparse.Namespace) -> int:
    from .recommend import format_text, load_frame, recommend, write_default

    rec = recommend(load_frame(args.db), tolerance=args.tolerance, device=args.device, time_metric=args.time)
    print(format_text(rec))
    if args.write:
        if rec.spec is None or (rec.fallback and not args.force):
            print("growbench: not written: " + ("no eligible strategy" if rec.spec is None else
                                                "no strategy meets the rule (use --force to write the fallback)"),
                  file=sys.stderr)
            return 1
        path = write_default(rec, args.db, args.default_file)
        print(f"wrote {path}: strategies.make('default') is now {rec.spec}")
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    import dataclasses

    from .train_db import TrainDB
    from .train_sweep import run_train_sweep, train_presets, train_summary

    presets = train_presets()
    if args.preset not in presets:
        raise ValueError(f"unknown training preset {args.preset!r}; valid: {', '.join(presets)}")
    configs = presets[args.preset]
    if args.methods:
        # The preset's runs of these methods, plus each other method in the preset's plain design.
        plain = [c for c in configs if c.method == "default" and c == dataclasses.replace(
            c, n_heads=1, head_split="each", trigger="schedule", scale_policy="rescale", opt_state="pad")]
        keep = [c for c in configs if c.method in args.methods]
        configs = list(dict.fromkeys(keep + [dataclasses.replace(c, method=m) for m in args.methods for c in plain]))
    for name in ("datasets", "seeds"):
        values = getattr(args, name)
        if values:
            field = name[:-1]
            configs = list(dict.fromkeys(dataclasses.replace(c, **{field: v}) for v in values for c in configs))
    if args.device:
        configs = list(dict.fromkeys(dataclasses.replace(c, device=args.device) for c in configs))
    TrainDB(args.db).close()  # check, create and mark the file before a word is printed or a run trained
    print(f"{len(configs)} training runs -> {args.db}", file=sys.stderr)
    runs = run_train_sweep(configs, args.db, jobs=args.jobs, resume=not args.no_resume,
                           retry_failed=args.retry_failed, progress=not args.no_progress)
    table = train_summary(runs)
    if not table.empty:
        print(table.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    return 1 if (runs.status != "ok").any() else 0


def _cmd_targets(args: argparse.Namespace) -> int:
    from .targets import run_targets

    table = run_targets(repeats=args.repeats, device=args.device, cache_dir=args.cache_dir,
                        scale=not args.skip_scale)
    if args.out:
        Path(args.out).write_text(table + "\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``growbench``."""
    from .sweep import DEFAULT_CACHE, DEFAULT_DB

    parser = argparse.ArgumentParser(prog="growbench", description="Benchmark strategies that grow attention's d_k.")
    sub = parser.add_subparsers(dest="command", required=True)

    p_list = sub.add_parser("list", help="list strategies, presets, datasets and sweep presets")
    p_list.add_argument("--json", action="store_true", help="machine-readable output")
    p_list.set_defaults(func=_cmd_list)

    p_run = sub.add_parser("run", help="run an ablation sweep into the results database",
                           description="Run the product strategies × datasets × sizes × seeds × devices. "
                                       "List options override the preset's values.")
    p_run.add_argument("--preset", help="sweep preset: smoke (<1 min), quick (<10 min), full")
    p_run.add_argument("--strategies", type=_csv(str), help="comma-separated specs or preset names")
    p_run.add_argument("--datasets", type=_csv(str), help="comma-separated dataset names")
    for axis, what in (("d-s", "sequence lengths"), ("d-e", "embedding widths"), ("b", "batch sizes"),
                       ("d-k", "initial query/key widths"), ("p", "columns added"), ("seeds", "seeds")):
        p_run.add_argument(f"--{axis}", dest=axis.replace("-", "_"), type=_csv(int), help=f"comma-separated {what}")
    p_run.add_argument("--devices", type=_csv(str), help="comma-separated devices (cpu, cuda)")
    p_run.add_argument("--n-batches", type=int, help="batches of statistics per run")
    p_run.add_argument("--repeats", type=int, help="timed repeats per run (median reported)")
    p_run.add_argument("--warmup-steps", type=int, help="training steps before growth")
    p_run.add_argument("--db", default=DEFAULT_DB, help=f"SQLite results file (default {DEFAULT_DB})")
    p_run.add_argument("--cache-dir", default=DEFAULT_CACHE, help=f"trained-model cache (default {DEFAULT_CACHE})")
    p_run.add_argument("--no-cache", action="store_true", help="retrain every model, cache nothing")
    p_run.add_argument("--resume", action="store_true", help="skip runs already in the database")
    p_run.add_argument("--retry-failed", action="store_true", help="with --resume, run stored failures again")
    p_run.add_argument("--jobs", type=int, default=1, help="parallel workers (joblib backend)")
    p_run.add_argument("--backend", default="joblib", choices=["joblib", "dask"])
    p_run.add_argument("--scheduler", help="Dask scheduler address (dask backend; default: a local cluster)")
    p_run.add_argument("--no-progress", action="store_true", help="no progress bar")
    p_run.set_defaults(func=_cmd_run)

    p_tr = sub.add_parser("train", help="growth during training: curves of grown vs fixed blocks into the database",
                          description="Train blocks from a small d_k, grown every K steps with each method, "
                                      "next to fixed-size baselines; resumes by default.")
    p_tr.add_argument("--preset", default="quick", help="smoke (<2 min), quick (<15 min on 2 cores), full")
    p_tr.add_argument("--methods", type=_csv(str),
                      help="replace the preset's single-head methods by these (specs, presets, baselines, "
                           "fixed-small, fixed-large)")
    p_tr.add_argument("--datasets", type=_csv(str), help="comma-separated dataset names")
    p_tr.add_argument("--seeds", type=_csv(int), help="comma-separated seeds")
    p_tr.add_argument("--device", help="cpu or cuda (default: the preset's, cpu)")
    p_tr.add_argument("--db", default=DEFAULT_DB, help=f"SQLite results file (default {DEFAULT_DB})")
    p_tr.add_argument("--no-resume", action="store_true", help="rerun runs already in the database")
    p_tr.add_argument("--retry-failed", action="store_true", help="run stored failures again")
    p_tr.add_argument("--jobs", type=int, default=1, help="parallel workers (joblib)")
    p_tr.add_argument("--no-progress", action="store_true", help="no progress bar")
    p_tr.set_defaults(func=_cmd_train)

    p_exp = sub.add_parser("export", help="export the results database")
    p_exp.add_argument("--format", choices=["csv", "parquet"], default="csv")
    p_exp.add_argument("--db", default=DEFAULT_DB, help=f"SQLite results file (default {DEFAULT_DB})")
    p_exp.add_argument("--out", help="output file (default: the database's name with the format's suffix)")
    p_exp.set_defaults(func=_cmd_export)

    p_tg = sub.add_parser("targets", help="measure the speed and quality targets in one process, as a Markdown table")
    p_tg.add_argument("--repeats", type=int, default=5, help="timed repeats per figure (median reported)")
    p_tg.add_argument("--device", default="cpu", help="cpu or cuda")
    p_tg.add_argument("--cache-dir", default=DEFAULT_CACHE, help=f"trained-model cache (default {DEFAULT_CACHE})")
    p_tg.add_argument("--skip-scale", action="store_true",
                      help="leave out the scale set (d_e 64..1024 on cpu, 64..4096 on cuda)")
    p_tg.add_argument("--out", help="also write the Markdown table to this file")
    p_tg.set_defaults(func=_cmd_targets)

    p_ex = sub.add_parser("example", help="grow the reference block once with every preset and print a table")
    p_ex.add_argument("--b", type=int, default=256, help="batch size (default 256)")
    p_ex.add_argument("--d-s", type=int, default=128, help="sequence length (default 128)")
    p_ex.add_argument("--d-e", type=int, default=64, help="embedding width (default 64)")
    p_ex.add_argument("--d-k", type=int, default=8, help="student's query/key width (default 8)")
    p_ex.add_argument("--p", type=int, default=8, help="columns to add (default 8)")
    p_ex.add_argument("--cond", type=float, default=100.0, help="condition number of the input covariance")
    p_ex.add_argument("--repeats", type=int, default=5, help="timed repeats after one warm-up (median reported)")
    p_ex.add_argument("--seed", type=int, default=0)
    p_ex.add_argument("--device", default="cpu", help="cpu or cuda")
    p_ex.add_argument("--presets", default="", help="comma-separated preset names or specs (default: every preset)")
    p_ex.add_argument("--json", default="", help="also write the table to this JSON file")
    p_ex.set_defaults(func=_cmd_example)

    p_rep = sub.add_parser("report", help="write the ablation report (HTML, Markdown, figures, CSV)")
    p_rep.add_argument("--db", default=DEFAULT_DB, help=f"SQLite results file (default {DEFAULT_DB})")
    p_rep.add_argument("--out", default="reports", help="output folder (default reports/)")
    p_rep.add_argument("--no-svg", action="store_true", help="write PNG figures only")
    p_rep.add_argument("--device", help="device whose runs the recommendation uses (default: the most frequent)")
    p_rep.set_defaults(func=_cmd_report)

    p_rec = sub.add_parser("recommend", help="choose the default strategy from the results by a documented rule")
    p_rec.add_argument("--db", default=DEFAULT_DB, help=f"SQLite results file (default {DEFAULT_DB})")
    p_rec.add_argument("--device", help="device whose runs count (default: the most frequent)")
    p_rec.add_argument("--tolerance", type=float, default=0.02,
                       help="quality tolerance as a fraction of |best| (default 0.02, the documented rule)")
    p_rec.add_argument("--time", choices=["t_total", "x_floor"], default="t_total",
                       help="rank by median t_total (the rule) or by t_total/t_floor (robust to a busy machine)")
    p_rec.add_argument("--write", action="store_true", help="write the choice to strategies/default.json")
    p_rec.add_argument("--force", action="store_true", help="with --write, also write a fallback choice")
    p_rec.add_argument("--default-file", help="write here instead of strategies/default.json")
    p_rec.set_defaults(func=_cmd_recommend)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``growbench`` console script."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:
        print(f"growbench: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # any filesystem failure left unchecked: one line naming the path, not a traceback
        where = f"{e.filename}: " if e.filename else ""
        print(f"growbench: error: {where}{e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("growbench: interrupted; finished runs are in the database (use --resume)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
