"""The ``growbench`` command line.

``list``, ``run``, ``train``, ``export``, ``report``, ``recommend``, ``targets``, ``example``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from growbench import strategies
from growbench.harness.allocator import allocator, keep_freed_memory
from growbench.harness.env import DEFAULT_THREADS
from growbench.harness.measure import HELDOUT_BATCHES
from growbench.harness.plugins import load_plugins
from growbench.harness.recommend import TOLERANCE as RULE_TOLERANCE
from growbench.harness.runner.sweep import DEFAULT_CACHE, DEFAULT_DB
from growbench.harness.validate import MAX_WORKERS, SQLITE_INT_MAX, ConfigError

# The option that sets each configuration field a ConfigError can name, per command (the rest are
# "--" + field with dashes). Training sizes come from the preset only.
_PLURAL = {"strategy": "--strategies", "dataset": "--datasets", "seed": "--seeds", "method": "--methods"}
_OPTIONS = {
    "run": {**_PLURAL, "device": "--devices", "d_k+p": "--d-k/--p", "memory": "--b/--d-s/--d-e/--n-batches",
            "dtype": "--preset", "scale_policy": "--preset"},
    "train": {**_PLURAL, **dict.fromkeys(("d_s", "d_e", "b", "d_k0", "d_k_max", "p", "n_heads", "stats_batches",
                                          "steps", "dtype", "memory"), "--preset")},
    "example": {"d_k+p": "--d-k/--p", "memory": "--b/--d-s/--d-e"},
}
# What to do after an interrupt, per command: finished runs are stored either way.
_RESUME_HINT = dict.fromkeys(("run", "train"),
                             "rerun the same command to skip them: it resumes unless given --no-resume")


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr (exit 2), like every other refusal."""

    def error(self, message: str) -> NoReturn:
        """Print ``<prog>: error: <message>`` and exit with status 2."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _csv(kind):
    """An argparse type for comma-separated, non-empty lists of ``kind``."""

    def parse(text: str) -> list:
        try:
            values = [kind(x) for x in text.split(",") if x.strip()]
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__}s, got {text!r}") from e
        if not values:  # an empty list would make a sweep of nothing, silently
            raise argparse.ArgumentTypeError(f"expected a non-empty comma-separated list, got {text!r}")
        return values

    return parse


def _int_at_least(minimum: int, maximum: int = SQLITE_INT_MAX) -> Callable[[str], int]:
    """An argparse type for integers from ``minimum`` to ``maximum`` (by default the largest SQLite stores)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {value}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be an integer from {minimum} to {maximum}, got {value}")
        return value

    return parse


def _float_at_least(minimum: float, strict: bool = False) -> Callable[[str], float]:
    """An argparse type for finite numbers ``>= minimum`` (``> minimum`` when ``strict``)."""
    bound = f"> {minimum:g}" if strict else f">= {minimum:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got {text!r}") from None
        if not math.isfinite(value) or value < minimum or (strict and value == minimum):
            raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got {text!r}")
        return value

    return parse


def _regime_key(text: str) -> str:
    """An argparse type for a regime key (``cpu/medium``); the message lists the valid ones."""
    from growbench.strategies.regimes import Regime

    try:
        return Regime.parse(text.strip().lower()).key
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _option(command: str, field: str) -> str:
    """The option of ``command`` that sets configuration ``field`` (for a one-line refusal)."""
    return _OPTIONS.get(command, {}).get(field, "--" + field.replace("_", "-"))


def _datasets() -> dict[str, str]:
    from growbench.datasets.registry import DATASETS

    return {name: cls.description for name, cls in DATASETS.items()}


def _cmd_list(args: argparse.Namespace) -> int:
    from growbench.harness.runner.sweep import count_configs, sweep_presets

    presets = sweep_presets()
    sweeps = {name: [{k: v for k, v in g.items() if k != "strategies"} | {"n_strategies": len(g["strategies"])}
                     for g in grids] for name, grids in presets.items()}
    from growbench.harness.runner.train_sweep import train_presets

    data = {"presets": strategies.presets(), "strategies": strategies.specs(), "datasets": _datasets(),
            "sweep_presets": sweeps,
            "train_presets": {name: [c.as_dict() for c in cs] for name, cs in train_presets().items()}}
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print("strategy presets:")
    for name, spec in data["presets"].items():
        print(f"  {name:10s} {spec}")
    print(f"strategies: {len(data['strategies'])} specs, "
          "averaging/inverse/truncation[+metric]/line_search[+holdout][+shrink][+damp]:method")
    print("datasets:")
    for name, desc in data["datasets"].items():
        print(f"  {name:15s} {desc}")
    print("sweep presets:")
    for name, grids in sweeps.items():
        print(f"  {name:6s} {count_configs(presets[name])} runs in {len(grids)} grid(s)")
    print("training presets (growbench train):")
    for name, configs in data["train_presets"].items():
        print(f"  {name:6s} {len(configs)} runs")
    return 0


def _grids(args: argparse.Namespace) -> list[dict]:
    from growbench.harness.runner.sweep import DATASET_NAMES, sweep_presets

    presets = sweep_presets()
    if args.preset:
        if args.preset not in presets:
            raise ValueError(f"unknown sweep preset {args.preset!r}; valid: {', '.join(presets)}")
        grids = [dict(g) for g in presets[args.preset]]
    else:
        grids = [dict(strategies=["default"], datasets=list(DATASET_NAMES), d_s=[16], d_e=[32], b=[64], d_k=[4],
                      p=[4], seeds=[0], devices=["cpu"])]
    overrides = {k: getattr(args, k) for k in ("strategies", "datasets", "d_s", "d_e", "b", "d_k", "p", "seeds",
                                               "devices", "n_batches", "repeats", "warmup_steps", "heldout_batches")}
    for g in grids:
        g.update({k: v for k, v in overrides.items() if v is not None})
    return grids


def _cmd_run(args: argparse.Namespace) -> int:
    import pandas as pd

    from growbench.harness.runner.pool import check_run_timeout
    from growbench.harness.runner.sweep import expand, run_sweep
    from growbench.harness.store.results import ResultsDB
    from growbench.harness.validate import check_runs

    configs, skipping = _without_missing_extra(expand(_grids(args)), "run",
                                               by_name=bool(args.datasets) or not args.preset)
    # Every run is checked before the database is touched. Devices named on the command line must be
    # present; a preset's cuda runs are skipped on a machine without a GPU, as documented.
    check_runs(configs, jobs=args.jobs, max_memory=args.max_memory, strict_devices=args.devices is not None)
    check_run_timeout(args.run_timeout, args.backend)
    ResultsDB(args.db).close()  # check, create and mark the file before a word is printed or a run measured
    for line in skipping:
        print(line, file=sys.stderr)
    print(f"{len(configs)} runs -> {args.db}", file=sys.stderr)
    _mixing_note(configs, args.db)
    _warmup_note(configs)
    frame = run_sweep(configs, args.db, jobs=args.jobs, backend=args.backend, scheduler=args.scheduler,
                      resume=not args.no_resume, retry_failed=args.retry_failed,
                      cache_dir=None if args.no_cache else args.cache_dir, progress=not args.no_progress,
                      threads=args.threads, max_memory=args.max_memory, run_timeout=args.run_timeout)
    _print_sweep_summary(frame)
    n_failed = int((frame.status != "ok").sum()) if len(frame) else 0
    if n_failed:
        from growbench.harness.recommend import first_error

        first = frame[frame.status != "ok"].iloc[0]
        print(f"{n_failed} failed runs recorded (first: {first.strategy} on {first.dataset}: "
              f"{first_error(pd.Series([first.error]))})", file=sys.stderr)
    return 0


#: Lines of the sweep's summary above which only the presets and each dataset's best strategy are printed.
SUMMARY_LINES = 40


def sweep_summary(frame) -> tuple:
    """What the report says of these runs, one line per regime × dataset × growth strategy: ``(table, note)``.

    The same measure, units and grouping as the report and the recommendation (:mod:`harness.recommend`): per
    regime, only each dataset's reference configuration counts (:func:`~harness.recommend.reference_runs`), and a
    strategy's held-out gain is its held-out loss decrease as a share of the held-out loss before the growth, the
    mean over seeds with its 95 % interval (:class:`~harness.recommend.SeedRuns`, :class:`~harness.recommend.Paired`);
    optimality and time are medians over seeds. Baselines and runs of other configurations (the scaling, the
    statistics-tokens study) are left out, as from the report's tables: ``note`` counts them.

    Parameters
    ----------
    frame : pandas.DataFrame
        Runs as stored (failed ones included: they are counted per line).

    Returns
    -------
    table : pandas.DataFrame
        Columns ``regime, dataset, strategy, preset, seeds, held-out gain, optimality, time_ms, failed``: the spec
        and its preset name (``default`` where it is the regime's choice), the gain as text (``+0.702% [+0.166,
        +1.24]``) as in the report, and ``gain`` (the mean, a share) for sorting.
    note : str
        What the table leaves out, in one sentence; empty when nothing is.
    """
    import pandas as pd

    from growbench.harness.recommend import (
        SeedRuns,
        clean_timings,
        dataset_name,
        is_growth,
        preset_names,
        reference_runs,
        regimes_with_runs,
        run_regimes,
    )
    from growbench.strategies.spec import default_specs

    columns = ["regime", "dataset", "strategy", "preset", "seeds", "held-out gain", "optimality", "time_ms", "failed",
               "gain"]
    if frame.empty:
        return pd.DataFrame(columns=columns), ""
    frame = clean_timings(frame)  # a NULL or infinite timing is no time: a missing one, not an error
    rows, counted = [], 0
    regime_of = run_regimes(frame)
    choices = default_specs()
    for rank, regime in enumerate(regimes_with_runs(frame)):
        # "default" names the regime's own choice: the reference regime's spec is no default in another band.
        names = {spec: name for spec, name in preset_names().items() if name != "default"}
        names[choices[regime].spec] = "default"
        mine = frame[regime_of == regime.key]
        ref = reference_runs(mine)
        runs = SeedRuns.of(ref)
        counted += int(ref.strategy.isin(runs.medians.index.get_level_values("strategy")).sum())
        failed = mine[mine.status != "ok"].groupby(["dataset", "strategy"]).size()
        shown = {(dataset_name(d), s) for s, d in runs.medians.index}
        for (dataset, strategy), n in failed.items():  # every run failed: still a line, saying so
            if (dataset, strategy) not in shown and is_growth(strategy):
                rows.append({"rank": rank, "regime": regime.describe(), "dataset": dataset, "strategy": strategy,
                             "preset": names.get(strategy, ""), "seeds": 0, "held-out gain": "n/a: every run failed",
                             "optimality": math.nan, "time_ms": math.nan, "failed": int(n), "gain": -math.inf})
        for strategy, dataset in runs.medians.index:
            gain = runs.gain(strategy, dataset)
            text = (f"{100 * gain.mean:+.3g}%" + (f" [{100 * gain.low:+.3g}, {100 * gain.high:+.3g}]" if gain.n > 1
                                                  else " (1 seed: no interval)")) if gain.n else "n/a"
            rows.append({"rank": rank, "regime": regime.describe(), "dataset": dataset,
                         "strategy": strategy, "preset": names.get(strategy, ""), "seeds": gain.n,
                         "held-out gain": text,
                         "optimality": runs.value(strategy, dataset, "optimality"),
                         "time_ms": 1e3 * runs.value(strategy, dataset, "t_total"),
                         "failed": int(failed.get((dataset_name(dataset), strategy), 0)), "gain": gain.mean})
    table = pd.DataFrame(rows, columns=["rank", *columns])
    # Regimes as the report orders them (cpu first, narrowest band first), then datasets, the highest gain first.
    table = table.sort_values(["rank", "dataset", "gain"], ascending=[True, True, False], kind="stable")
    table = table.drop(columns="rank")
    left = int((frame.status == "ok").sum()) - counted
    note = (f"{left} successful runs are not in this table: baselines and other configurations than each dataset's "
            "reference one (the scaling, the statistics-tokens study); growbench report shows them"
            if left > 0 else "")
    return table.reset_index(drop=True), note


def _print_sweep_summary(frame) -> None:
    """Print :func:`sweep_summary`: every line, or beyond :data:`SUMMARY_LINES` the presets and each dataset's best."""
    import pandas as pd

    table, note = sweep_summary(frame)
    if table.empty:
        print("no successful growth run to summarise" + (f" ({note})" if note else ""))
        return
    print("held-out gain: the held-out loss decrease as a share of the held-out loss before growth, mean over seeds "
          "[95% interval], on each dataset's reference configuration, as in the report; optimality and time: medians "
          "over seeds")
    if len(table) > SUMMARY_LINES:
        best = table.groupby(["regime", "dataset"], sort=False).head(1).index
        keep = table.index.isin(best) | (table.preset != "")
        print(f"{len(table)} regime × dataset × strategy lines; the presets and each dataset's best follow "
              "(growbench report for all of them, growbench export for every run)")
        table = table[keep]
    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.max_rows", 500,
                           "display.max_colwidth", 60):
        print(table.drop(columns="gain").to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    if note:
        print(note)


def _without_missing_extra(configs: list, command: str, *, by_name: bool) -> tuple[list, list[str]]:
    """``configs`` less the real model's runs when the ``real`` extra is missing here, and the lines that say so.

    A preset that mixes them with others leaves them out (a GPU host without the extra still runs the rest);
    asked for by name (``by_name``), or with nothing else left, they are refused. The caller prints the lines
    once every other check has passed, so that a refusal stays one line.
    """
    from growbench.harness.validate import runnable_here

    runnable, missing = runnable_here(configs)
    if missing and (by_name or not runnable):
        raise ConfigError("dataset", missing[0])
    return runnable, [f"growbench {command}: skipping the real model's runs: {why}" for why in missing]


def _mixing_note(configs: list, db_path: str) -> None:
    """Warn, in one line, when the database holds runs of other configurations: the report would count them."""
    from growbench.harness.runner.sweep import presets_holding, runs_outside
    from growbench.harness.store.results import ResultsDB

    with ResultsDB(db_path) as db:
        other = runs_outside(db.frame(), configs)
    if len(other):
        names = presets_holding(other)
        which = f" (preset {', '.join(names)})" if names else ""
        print(f"growbench run: warning: {db_path} already holds {len(other)} runs of other configurations{which}; "
              "the report will count them with these: give this sweep its own --db FILE to keep them apart",
              file=sys.stderr)


def _warmup_note(configs: list) -> None:
    """Say on stderr, in one line, what long warm-ups will cost before the sweep starts them."""
    from growbench.harness.validate import WARMUP_NOTE_STEPS, warmup_seconds

    steps = max((c.warmup_steps for c in configs), default=0)
    if steps > WARMUP_NOTE_STEPS:
        seconds = warmup_seconds(configs)
        cost = (f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 else
                f"{seconds / 3600:.1f} h")
        print(f"growbench run: note: --warmup-steps {steps}: about {cost} of warm-up training on one thread before "
              f"the growths (estimated; models already in the cache are not retrained)", file=sys.stderr)


def _cmd_export(args: argparse.Namespace) -> int:
    """Write every run of ``--db`` to ``--out`` as CSV or parquet, atomically (:func:`harness.files.write_frame`).

    ``--out`` is refused before the database is read when it is the database itself (or one of its
    journal files), a FIFO, a device or a folder. CSV cells that a spreadsheet would run as formulas are
    written as text; parquet gets columns of mixed types (text in a numeric column) as text.
    """
    from growbench.harness.files import check_output_file, write_frame
    from growbench.harness.store.results import read_runs

    if not Path(args.db).exists():
        raise ValueError(f"no results database at {args.db}: run 'growbench run' first")
    out = args.out or str(Path(args.db).with_suffix("." + args.format))
    inputs = [("--db", args.db), *(("--db's journal", f"{args.db}{s}") for s in ("-wal", "-shm", "-journal"))]
    check_output_file(out, "--out", inputs)  # before reading: a bad --out is the user's to fix first
    frame = read_runs(args.db)  # read only: exporting never changes the database
    write_frame(frame, out, args.format)
    print(f"{len(frame)} runs -> {out}")
    return 0


def _cmd_example(args: argparse.Namespace) -> int:
    import pandas as pd

    from growbench.harness.env import torch_threads
    from growbench.harness.example import run_example
    from growbench.harness.files import check_output_file, replace_file
    from growbench.harness.validate import check_example

    if args.json:
        check_output_file(args.json, "--json")
    names = args.presets.split(",") if args.presets else None
    for n in names or []:
        try:
            strategies.parse(n)  # unknown names fail before any work, with the valid list
        except ValueError as e:
            raise ConfigError("presets", str(e)) from None
    check_example(b=args.b, d_s=args.d_s, d_e=args.d_e, d_k=args.d_k, p=args.p, cond=args.cond,
                  repeats=args.repeats, device=args.device, max_memory=args.max_memory)
    with torch_threads(args.threads):
        df = run_example(b=args.b, d_s=args.d_s, d_e=args.d_e, d_k=args.d_k, p=args.p, cond=args.cond,
                         repeats=args.repeats, seed=args.seed, device=args.device, names=names,
                         max_memory=args.max_memory)
    print("problem:", ", ".join(f"{k}={v}" for k, v in df.attrs["problem"].items()))
    print(f"bottleneck ‖ΠG‖/‖G‖ = {df.attrs['bottleneck']:.4f}")
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_colwidth", 60):
        print(df.drop(columns=["fallback"]).to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    for _, row in df[df.fallback != ""].iterrows():
        print(f"fallback in {row.preset}: {row.fallback}")
    if args.json:
        replace_file(Path(args.json), df.to_json(orient="records", indent=2))
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from growbench.harness.report.build import build_report
    from growbench.harness.store.dbfile import check_output_dir

    check_output_dir(args.out)  # before any work: an existing file or a read-only folder is refused in one line
    done = build_report(args.db, args.out, svg=not args.no_svg, device=args.device)
    print(f"report of {args.db} -> {Path(args.out) / 'report.html'} ({len(done['files'])} files; figures: "
          f"{', '.join(done['figures']) or 'none'})")
    for note in done["notes"]:
        print(f"  no figure: {note}")
    return 0


def _cmd_recommend(args: argparse.Namespace) -> int:
    from growbench.harness.recommend import format_regimes, load_frame, recommend, recommend_regimes, write_default

    frame = load_frame(args.db)
    if args.device:
        frame = frame[frame.device == args.device]
    if args.regime:
        recs = {args.regime: recommend(frame, tolerance=args.tolerance, time_metric=args.time, regime=args.regime)}
    else:
        recs = recommend_regimes(frame, tolerance=args.tolerance, time_metric=args.time)
    print(format_regimes(recs))
    if args.write:
        from growbench.harness.recommend import CLOSEST

        missing = [k for k, r in recs.items() if r.spec is None]
        # A regime where growth does not generalise has an answer (its statement); one where strategies generalise
        # but none meets the rule everywhere has only a best effort, written on request.
        fallen = [k for k, r in recs.items() if r.verdict == CLOSEST]
        if missing or (fallen and not args.force):
            print("growbench: not written: " + (f"no eligible strategy in {', '.join(missing)}" if missing else
                                                f"no strategy meets the rule in {', '.join(fallen)} "
                                                "(use --force to write the closest one)"),
                  file=sys.stderr)
            return 1
        path, changes = write_default(recs, args.db, args.default_file)
        print(f"wrote {path}; strategies.make('default') now runs, per regime:")
        for line in changes:
            print(f"  {line}")
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    import dataclasses

    from growbench.harness.runner.train_sweep import run_train_sweep, train_presets, train_summary
    from growbench.harness.store.training import TrainDB
    from growbench.harness.train import FIXED_METHODS
    from growbench.harness.validate import check_device, check_train_configs, dataset_class

    presets = train_presets()
    if args.preset not in presets:
        raise ConfigError("preset", f"unknown training preset {args.preset!r}; valid: {', '.join(presets)}")
    for m in args.methods or []:
        if m not in FIXED_METHODS:
            try:
                strategies.canonical(m)
            except ValueError as e:
                raise ConfigError("method", f"unknown training method {m!r}: {e}; "
                                            f"or one of {', '.join(FIXED_METHODS)}") from None
    for d in args.datasets or []:
        dataset_class(d)
    if args.device:
        check_device(args.device)
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
    configs, skipping = _without_missing_extra(configs, "train", by_name=bool(args.datasets))
    check_train_configs(configs, jobs=args.jobs, max_memory=args.max_memory, strict_devices=bool(args.device))
    TrainDB(args.db).close()  # check, create and mark the file before a word is printed or a run trained
    for line in skipping:
        print(line, file=sys.stderr)
    print(f"{len(configs)} training runs -> {args.db}", file=sys.stderr)
    runs = run_train_sweep(configs, args.db, jobs=args.jobs, resume=not args.no_resume,
                           retry_failed=args.retry_failed, progress=not args.no_progress, threads=args.threads,
                           max_memory=args.max_memory, run_timeout=args.run_timeout)
    table = train_summary(runs)
    if not table.empty:
        print(table.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    return 1 if (runs.status != "ok").any() else 0


def _cmd_targets(args: argparse.Namespace) -> int:
    import torch

    from growbench.harness.env import cpu_capability, device_name, torch_threads
    from growbench.harness.files import check_output_file, replace_file
    from growbench.harness.targets import run_targets
    from growbench.harness.validate import check_device

    check_device(args.device)
    if args.out:
        check_output_file(args.out)
    with torch_threads(args.threads):
        # Every figure below depends on the thread count, the allocator and the CPU's kernels: say them first, and
        # in the table.
        where = (f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {args.device} "
                 f"({device_name(args.device)}, CPU kernels {cpu_capability()}), allocator: {allocator()}")
        print(where, flush=True)
        table = run_targets(repeats=args.repeats, device=args.device, cache_dir=args.cache_dir,
                            scale=not args.skip_scale)
    if args.out:
        replace_file(Path(args.out), f"{where}\n\n{table}\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``growbench``: one sub-parser per command, each added by its own function."""
    parser = _Parser(prog="growbench", description="Benchmark strategies that grow attention's d_k.")
    sub = parser.add_subparsers(dest="command", required=True)
    for add_command in (_add_list, _add_run, _add_train, _add_export, _add_targets, _add_example, _add_report,
                        _add_recommend):
        add_command(sub)
    return parser


def _add_list(sub: argparse._SubParsersAction) -> None:
    """The ``list`` command."""
    parser = sub.add_parser("list", help="list strategies, presets, datasets and sweep presets")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=_cmd_list)


def _add_run(sub: argparse._SubParsersAction) -> None:
    """The ``run`` command."""
    parser = sub.add_parser("run", help="run an ablation sweep into the results database",
                            description="Run the product strategies × datasets × sizes × seeds × devices. "
                                        "List options override the preset's values.")
    parser.add_argument("--preset", help="sweep preset: smoke (<1 min), quick (the main job's, ~13 min with --jobs 2 "
                                         "on a busy 2-core machine), thorough (~30 min), gpu, full (days)")
    parser.add_argument("--strategies", type=_csv(str), help="comma-separated specs or preset names")
    parser.add_argument("--datasets", type=_csv(str), help="comma-separated dataset names")
    for axis, what in (("d-s", "sequence lengths"), ("d-e", "embedding widths"), ("b", "batch sizes"),
                       ("d-k", "initial query/key widths"), ("p", "columns added"), ("seeds", "seeds")):
        parser.add_argument(f"--{axis}", dest=axis.replace("-", "_"), type=_csv(int), help=f"comma-separated {what}")
    parser.add_argument("--devices", type=_csv(str), help="comma-separated devices (cpu, cuda)")
    parser.add_argument("--n-batches", type=_int_at_least(1), help="batches of statistics per run")
    parser.add_argument("--repeats", type=_int_at_least(1), help="timed repeats per run (median reported)")
    parser.add_argument("--warmup-steps", type=_int_at_least(0), help="training steps before growth")
    parser.add_argument("--heldout-batches", type=_int_at_least(2),
                        help=f"test batches of the held-out measure (default {HELDOUT_BATCHES})")
    parser.add_argument("--db", default=DEFAULT_DB, help=f"SQLite results file (default {DEFAULT_DB})")
    parser.add_argument("--cache-dir", default=DEFAULT_CACHE, help=f"trained-model cache (default {DEFAULT_CACHE})")
    parser.add_argument("--no-cache", action="store_true", help="retrain every model, cache nothing")
    _resume_options(parser)
    parser.add_argument("--jobs", type=_int_at_least(1, MAX_WORKERS), default=1,
                        help="parallel workers (joblib backend)")
    _run_timeout(parser)
    _threads_and_memory(parser)
    parser.add_argument("--backend", default="joblib", choices=["joblib", "dask"])
    parser.add_argument("--scheduler", help="Dask scheduler address (dask backend; default: a local cluster)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=_cmd_run)


def _resume_options(parser: argparse.ArgumentParser) -> None:
    """``--resume`` (the default), ``--no-resume`` and ``--retry-failed``: alike for ``run`` and ``train``."""
    resume = parser.add_mutually_exclusive_group()
    resume.add_argument("--resume", action="store_true",
                        help="skip runs already in the database, failures included (the default)")
    resume.add_argument("--no-resume", action="store_true", help="rerun runs already in the database")
    parser.add_argument("--retry-failed", action="store_true", help="run stored failures again")


def _add_train(sub: argparse._SubParsersAction) -> None:
    """The ``train`` command."""
    parser = sub.add_parser("train", help="growth during training: curves of grown vs fixed blocks into the database",
                            description="Train blocks from a small d_k, grown every K steps with each method, "
                                        "next to fixed-size baselines; on the real model (preset real), narrow "
                                        "every head of a pretrained layer and grow them while distilling; "
                                        "resumes by default.")
    parser.add_argument("--preset", default="quick",
                        help="smoke (<2 min), quick (<15 min on 2 cores), real (the pretrained MiniLM, every head of "
                             "one layer narrowed and grown while distilling; ~13 min on 2 cores; extra `real`), "
                             "real-once (the same, grown to full width in one growth after the first step), "
                             "full (both, longer)")
    parser.add_argument("--methods", type=_csv(str),
                        help="replace the preset's single-head methods by these (specs, presets, baselines, "
                             "fixed-small, fixed-large)")
    parser.add_argument("--datasets", type=_csv(str), help="comma-separated dataset names")
    parser.add_argument("--seeds", type=_csv(int), help="comma-separated seeds")
    parser.add_argument("--device", help="cpu or cuda (default: the preset's, cpu)")
    parser.add_argument("--db", default=DEFAULT_DB, help=f"SQLite results file (default {DEFAULT_DB})")
    _resume_options(parser)
    parser.add_argument("--jobs", type=_int_at_least(1, MAX_WORKERS), default=1, help="parallel workers (joblib)")
    _run_timeout(parser)
    _threads_and_memory(parser)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=_cmd_train)


def _add_export(sub: argparse._SubParsersAction) -> None:
    """The ``export`` command."""
    parser = sub.add_parser("export", help="export the results database")
    parser.add_argument("--format", choices=["csv", "parquet"], default="csv")
    parser.add_argument("--db", default=DEFAULT_DB, help=f"SQLite results file (default {DEFAULT_DB})")
    parser.add_argument("--out", help="output file, replaced whole (default: the database's name with the format's "
                                      "suffix); never the database itself, a FIFO or a device")
    parser.set_defaults(func=_cmd_export)


def _add_targets(sub: argparse._SubParsersAction) -> None:
    """The ``targets`` command."""
    parser = sub.add_parser("targets", help="measure the speed and quality targets in one process, as a Markdown table")
    parser.add_argument("--repeats", type=_int_at_least(1), default=5,
                        help="timed repeats per figure (median reported)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--cache-dir", default=DEFAULT_CACHE, help=f"trained-model cache (default {DEFAULT_CACHE})")
    parser.add_argument("--skip-scale", action="store_true",
                        help="leave out the scale set (d_e 64..1024 on cpu, 64..4096 on cuda)")
    parser.add_argument("--out", help="also write the Markdown table to this file")
    _threads_and_memory(parser, memory=False)
    parser.set_defaults(func=_cmd_targets)


def _add_example(sub: argparse._SubParsersAction) -> None:
    """The ``example`` command."""
    parser = sub.add_parser("example", help="grow the reference block once with every preset and print a table")
    parser.add_argument("--b", type=int, default=256, help="batch size (default 256)")
    parser.add_argument("--d-s", type=int, default=128, help="sequence length (default 128)")
    parser.add_argument("--d-e", type=int, default=64, help="embedding width (default 64)")
    parser.add_argument("--d-k", type=int, default=8, help="student's query/key width (default 8)")
    parser.add_argument("--p", type=int, default=8, help="columns to add (default 8)")
    parser.add_argument("--cond", type=_float_at_least(1), default=100.0,
                        help="condition number of the input covariance, finite and >= 1 (default 100)")
    parser.add_argument("--repeats", type=_int_at_least(1), default=5,
                        help="timed repeats after one warm-up (median reported)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--presets", default="", help="comma-separated preset names or specs (default: every preset)")
    parser.add_argument("--json", default="", help="also write the table to this JSON file")
    _threads_and_memory(parser)
    parser.set_defaults(func=_cmd_example)


def _add_report(sub: argparse._SubParsersAction) -> None:
    """The ``report`` command."""
    parser = sub.add_parser("report", help="write the ablation report (HTML, Markdown, figures, CSV)")
    parser.add_argument("--db", default=DEFAULT_DB, help=f"SQLite results file (default {DEFAULT_DB})")
    parser.add_argument("--out", default="reports", help="output folder (default reports/)")
    parser.add_argument("--no-svg", action="store_true", help="write PNG figures only")
    parser.add_argument("--device", help="device whose runs the recommendation uses (default: the most frequent)")
    parser.set_defaults(func=_cmd_report)


def _add_recommend(sub: argparse._SubParsersAction) -> None:
    """The ``recommend`` command."""
    parser = sub.add_parser("recommend", help="choose the default strategy from the results by a documented rule")
    parser.add_argument("--db", default=DEFAULT_DB, help=f"SQLite results file (default {DEFAULT_DB})")
    parser.add_argument("--device", help="only the runs of this device count (default: every device)")
    parser.add_argument("--regime", type=_regime_key,
                        help="only this regime (device/band: cpu/small, cpu/medium, cpu/large, cuda/...; "
                             "default: every regime with runs)")
    parser.add_argument("--tolerance", type=_float_at_least(0), default=RULE_TOLERANCE,
                        help="how far below the best's held-out gain a strategy may be, as a fraction of it, beyond "
                             f"noise; finite and >= 0 (default {RULE_TOLERANCE:g}, the documented rule)")
    parser.add_argument("--time", choices=["t_total", "x_floor"], default="t_total",
                        help="rank by median t_total (the rule) or by t_total/t_floor (robust to a busy machine)")
    parser.add_argument("--write", action="store_true",
                        help="write the choice of every regime to strategies/default.json")
    parser.add_argument("--force", action="store_true", help="with --write, also write a fallback choice")
    parser.add_argument("--default-file", help="write here instead of strategies/default.json")
    parser.set_defaults(func=_cmd_recommend)
    return parser


def _run_timeout(parser: argparse.ArgumentParser) -> None:
    """Add ``--run-timeout`` to a command that runs a sweep."""
    parser.add_argument("--run-timeout", type=_float_at_least(0, strict=True), metavar="SECONDS",
                        help="stop a run that takes longer and record it as failed (default: no limit); runs then "
                             "go to worker processes even with --jobs 1, which costs a few seconds to start")


def _threads_and_memory(parser: argparse.ArgumentParser, memory: bool = True) -> None:
    """Add ``--threads`` (and ``--max-memory``) to a command that does the work."""
    parser.add_argument("--threads", type=_int_at_least(1, MAX_WORKERS), default=DEFAULT_THREADS,
                        help=f"torch threads per process doing the work, each worker's with --jobs > 1 (default "
                             f"{DEFAULT_THREADS}: at these sizes more threads gain little, and on a busy machine "
                             "they are several times slower)")
    if memory:
        parser.add_argument("--max-memory", type=_float_at_least(0, strict=True), metavar="GIB",
                            help="refuse a run whose estimated memory (times --jobs on cpu) exceeds this many GiB "
                                 "(default: 80%% of the machine's memory, 90%% of the GPU's)")


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``growbench`` console script."""
    args = build_parser().parse_args(argv)
    try:
        load_plugins()  # outside components, before any spec is read
        keep_freed_memory()  # floors and growths timed alike, without the kernel's page faults (harness.allocator)
        code = args.func(args)
        sys.stdout.flush()  # here, not at exit: a reader that went away (| head) is handled below
        return code
    except BrokenPipeError:
        # The reader closed the pipe (growbench list --json | head): stop quietly, as a writer killed by
        # SIGPIPE would; stdout goes to devnull so that the flush at exit does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13
    except ConfigError as e:
        print(f"growbench {args.command}: error: {_option(args.command, e.field)}: {_one_line(e)}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"growbench: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except OSError as e:  # any filesystem failure left unchecked: one line naming the path, not a traceback
        where = f"{e.filename}: " if e.filename else ""
        print(f"growbench: error: {where}{_one_line(e.strerror or e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        hint = _RESUME_HINT.get(args.command)
        print("growbench: interrupted" + (f"; finished runs are in the database, {hint}" if hint else ""),
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
