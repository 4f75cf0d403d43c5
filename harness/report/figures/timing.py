"""Where growth time goes and how it scales: phases against the floor, sizes, CPU against GPU."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from growbench import strategies
from growbench.harness.recommend import CELL_COLUMNS, is_growth, preset_names, reference_runs
from growbench.harness.report.figures.base import (
    MAX_WIDTH_IN,
    MIN_FONT_PT,
    FigureResult,
    bottom_legend,
    log_axis,
    panel_title,
    plain_text,
    stored_extra,
    strip_plot,
    theme,
)
from growbench.harness.report.figures.palette import (
    BLACK,
    GREEN,
    GREY,
    ORANGE,
    PURPLE,
    SKY,
    dataset_colors,
    family_colors,
)
from growbench.harness.report.names import short_label
from growbench.harness.report.wording import duration, plural, times

PHASES = ("t_statistics", "t_direction", "t_truncation", "t_line_search")
PHASE_NAMES = {"t_statistics": "statistics", "t_direction": "direction", "t_truncation": "truncation",
               "t_line_search": "line search", "other": "other"}
PHASE_COLORS = {"t_statistics": SKY, "t_direction": ORANGE, "t_truncation": GREEN, "t_line_search": PURPLE,
                "other": GREY}
# The presets whose phase split the caption's table names first (the rest follow by total time).
BREAKDOWN_PRESETS = ("formula1", "formula2", "formula4", "joint", "default")
SIZES = ("d_e", "d_s", "b")


# ------------------------------------------------------------------ time breakdown
def phase_medians(frame: pd.DataFrame) -> pd.DataFrame:
    """Per dataset and strategy of the reference runs: median phase times and total over the run's floor,
    ``other`` (total minus the phases) and the median ``t_total`` in ms."""
    ref = reference_runs(frame)
    ref = ref[(ref.t_floor > 0) & ref.t_total.notna()]
    rel = ref[["dataset", "strategy"]].copy()
    for c in (*PHASES, "t_total"):
        rel[c] = ref[c].fillna(0) / ref.t_floor
    rel["ms"] = ref.t_total * 1e3
    med = rel.groupby(["dataset", "strategy"]).median()
    med["other"] = (med.t_total - med[list(PHASES)].sum(axis=1)).clip(lower=0)
    return med.reset_index()


def _draw_bars(ax, m: pd.DataFrame) -> None:
    """One dataset's stacked phase bars, each labelled with its median time; bars beyond three times the
    upper quartile are cut (one outlier must not flatten the others) and marked ▶."""
    left = np.zeros(len(m))
    for phase in [*PHASES, "other"]:
        values = m[phase].fillna(0).to_numpy()
        ax.barh(range(len(m)), values, left=left, color=PHASE_COLORS[phase], label=PHASE_NAMES[phase], height=0.75)
        left += values
    ax.axvline(1.0, color=BLACK, lw=1.4, label="floor (Gram sums + 1 loss evaluation) = 1")
    totals = m.t_total.dropna().to_numpy()
    cap = max(min(float(totals.max()), 3 * float(np.percentile(totals, 75))), 1.5) if len(totals) else 1.5
    for i, (total, ms) in enumerate(zip(m.t_total, m.ms, strict=True)):
        if not np.isfinite(total):
            continue
        if total > cap:
            ax.text(cap * 1.005, i, f"▶ {total:.3g}×", va="center", fontsize=MIN_FONT_PT, color="#b00")
        else:
            ax.text(total + 0.02 * cap, i, duration(ms), va="center", fontsize=MIN_FONT_PT, color="#444")
    ax.set_xlim(0, cap * 1.7)
    ax.set_title(panel_title(m.dataset.dropna().iloc[0]))
    ax.set_xlabel("time / floor (×, median)")


def breakdown_rows(med: pd.DataFrame, per_row: int = 4) -> list[tuple[list[str], list[str]]]:
    """The figure's rows: datasets that ran the same strategies side by side (at most ``per_row``), with those
    strategies in order of their median time over every dataset, so that no panel has a row without a bar."""
    order = med.groupby("strategy").t_total.median().sort_values().index.tolist()
    groups: dict[frozenset, list[str]] = {}
    for ds in sorted(med.dataset.unique()):
        groups.setdefault(frozenset(med.strategy[med.dataset == ds]), []).append(ds)
    return [(datasets[i:i + per_row], [s for s in order if s in ran])
            for ran, datasets in groups.items() for i in range(0, len(datasets), per_row)]


def _phase_table(med: pd.DataFrame, names: dict[str, str]) -> pd.DataFrame:
    """Per strategy, medians over datasets: time as a multiple of the floor and each phase's share (%); the
    presets of :data:`BREAKDOWN_PRESETS` first, then by time."""
    tot = med.groupby("strategy")[[*PHASES, "other", "t_total"]].median()
    presets = {strategies.presets()[p]: i for i, p in enumerate(BREAKDOWN_PRESETS)}
    tot = tot[tot.t_total > 0].assign(first=lambda t: t.index.map(lambda s: presets.get(s, len(presets))))
    tot = tot.sort_values(["first", "t_total"])
    table = pd.DataFrame({"strategy": [short_label(s, names) for s in tot.index], "× floor": tot.t_total.to_numpy()})
    for phase in [*PHASES, "other"]:
        table[f"{PHASE_NAMES[phase]} (%)"] = (100 * tot[phase] / tot.t_total).to_numpy()
    return table


# ------------------------------------------------------------------ the default's profile
#: The growth's profiled sections (strategies.timing.Profile), in the order a growth runs them; a section not listed
#: (a component's own, a later one) follows in the order the run recorded it.
PROFILE_ORDER = ("inputs", "current scores", "statistics", "holdout split", "ridge strength", "factorisation",
                 "direction", "metric", "score change", "split-half estimate", "path slope", "line search",
                 "truncation", "trial scores", "loss calls", "refit: ridge strength", "refit: factorisation",
                 "refit: direction", "refit: metric", "refit: score change", "finish", "other")


def default_profiles(frame: pd.DataFrame) -> pd.DataFrame:
    """The default's growths, section by section: one row per reference run of the spec ``default.json`` names for
    the run's regime and section of its stored profile (``extra.info.profile``, one growth, the run's last timed
    repeat), with its ms, its multiple of the run's floor, and the run's loss calls and host reads."""
    ref = reference_runs(frame)
    if ref.empty or "extra" not in ref:
        return pd.DataFrame()
    ref = ref[(ref.t_floor > 0) & ref.t_total.notna()]
    chosen = {regime.key: choice.spec for regime, choice in strategies.spec.default_specs().items()}
    rows = []
    for run in ref.itertuples():
        try:
            regime = strategies.Regime.of(str(run.device), int(run.d_e)).key
        except (TypeError, ValueError):
            continue
        profile = stored_extra(run.extra).get("info", {}).get("profile")
        if run.strategy != chosen.get(regime) or not isinstance(profile, dict):
            continue
        sections = profile.get("ms")
        if not isinstance(sections, dict):
            continue
        calls = profile.get("calls") if isinstance(profile.get("calls"), dict) else {}
        for section, ms in sections.items():
            if isinstance(ms, int | float) and math.isfinite(ms):
                rows.append({"dataset": run.dataset, "d_e": int(run.d_e), "regime": regime, "strategy": run.strategy,
                             "seed": run.seed, "section": str(section), "ms": float(ms),
                             "x_floor": float(ms) / (1e3 * run.t_floor), "calls": calls.get(section),
                             "total_ms": profile.get("total_ms"), "floor_ms": 1e3 * run.t_floor,
                             "loss_calls": run.n_loss_evals,
                             "host_syncs": getattr(run, "host_syncs", math.nan)})
    return pd.DataFrame(rows)


def profile_details(profiles: pd.DataFrame) -> list[str]:
    """One statement per dataset (and width) of the default: its growth as a multiple of the floor, and the
    sections that make it up, largest first, each a median over seeds."""
    if profiles.empty:
        return []
    lines = []
    order = {name: i for i, name in enumerate(PROFILE_ORDER)}
    for (dataset, d_e, spec), runs in profiles.groupby(["dataset", "d_e", "strategy"], sort=True):
        per_run = runs.groupby("seed").agg(total_ms=("total_ms", "first"), floor_ms=("floor_ms", "first"),
                                           loss_calls=("loss_calls", "first"), host_syncs=("host_syncs", "first"))
        sections = runs.groupby("section").agg(ms=("ms", "median"), x_floor=("x_floor", "median"))
        sections = sections[sections.ms > 0].assign(first=lambda t: t.index.map(lambda n: order.get(n, len(order))))
        sections = sections.sort_values(["x_floor", "first"], ascending=[False, True])
        total, floor = float(per_run.total_ms.median()), float(per_run.floor_ms.median())
        parts = ", ".join(f"{name} {row.x_floor:.2g}×" for name, row in sections.iterrows() if row.x_floor >= 0.005)
        loss = per_run.loss_calls.median()
        syncs = per_run.host_syncs.median()
        lines.append(f"default on {dataset} (d_e {d_e}, {spec}): one growth {duration(total)} = "
                     f"{total / floor:.2g}× its floor ({duration(floor)}): {parts}; {loss:.0f} loss calls, "
                     + (f"{syncs:.0f} host reads (synchronisations on a GPU)" if math.isfinite(syncs) else
                        "host reads not recorded")
                     + f"; each run's last timed growth, median of {plural(len(per_run), 'seed')}.")
    return lines


def breakdown(frame: pd.DataFrame) -> FigureResult:
    """Stacked median phase times per strategy and dataset, in multiples of the run's floor."""
    theme()
    title = "Where the time goes: growth phases"
    med = phase_medians(frame)
    if med.empty:
        return FigureResult("breakdown", title, note="No successful runs with a measured floor.")
    names = preset_names()
    rows = breakdown_rows(med)
    ncols = max(len(datasets) for datasets, _ in rows)
    # Each row as tall as its bars need, plus its titles and axis label.
    heights = [1.5 + 0.26 * len(order) for _, order in rows]
    fig = plt.figure(figsize=(MAX_WIDTH_IN, sum(heights)))
    grid = fig.add_gridspec(len(rows), ncols, height_ratios=heights)
    axes = []
    for r, (datasets, order) in enumerate(rows):
        for c, ds in enumerate(datasets):
            ax = fig.add_subplot(grid[r, c])
            _draw_bars(ax, med[med.dataset == ds].set_index("strategy").reindex(order).reset_index())
            ax.set_yticks(range(len(order)), [plain_text(short_label(s, names)) for s in order] if c == 0 else [])
            ax.set_ylim(len(order) - 0.5, -0.5)
            axes.append(ax)
    fig.suptitle(title + " in multiples of the floor\n(medians over seeds; labels: median t_total)", fontweight="bold")
    bottom_legend(fig, axes[:1], ncol=3, top=0.97)

    growth = med[med.strategy.map(is_growth)].groupby("strategy")[[*PHASES, "t_total"]].median()
    caption = ("Bars split each strategy's median growth time into phases, in multiples of the same run's floor "
               "(timed between its repeats, so slow periods of the machine cancel), each panel showing the "
               "strategies run on its dataset; a red ▶ marks a bar cut at three times the panel's upper quartile.")
    if len(growth):
        fastest = growth.t_total.sort_values()
        n_line_search = int((growth[list(PHASES)].idxmax(axis=1) == "t_line_search").sum())
        share = float((growth.t_line_search / growth.t_total).median())
        caption += (f" The cheapest growth strategy relative to the floor is {short_label(fastest.index[0], names)} "
                    f"({times(fastest.iloc[0])} the floor), the most expensive {short_label(fastest.index[-1], names)} "
                    f"({times(fastest.iloc[-1])}); the line search is the largest phase for {n_line_search} of "
                    f"{len(growth)} growth strategies (median share {100 * share:.0f}%).")
    table = _phase_table(med, names)
    details = profile_details(default_profiles(frame))
    if details:
        caption += (" Below the table, the default's growth section by section (its profile: the ridge's strength, "
                    "the direction, the metric, the score change X P Xᵀ, the split-half estimate, each loss call, the "
                    "held-out refit, in multiples of the floor), and the numbers it read on the host.")
    return FigureResult("breakdown", title, caption, fig, data=med, table=table, details=details,
                        formats={c: ".2g" if c == "× floor" else ".0f" for c in table.columns[1:]})


# ------------------------------------------------------------------ scaling
def _fastest_repeat(run) -> float:
    """The fastest timed repeat of a run's growth (``extra.times.total``), else its median ``t_total``."""
    repeats = stored_extra(run.extra).get("times", {}).get("total")
    if isinstance(repeats, list) and repeats and all(isinstance(t, int | float) for t in repeats):
        return float(min(repeats))
    return float(run.t_total)


def _longest_series(ok: pd.DataFrame, axis: str) -> pd.DataFrame | None:
    """The runs of the group (everything but ``axis`` fixed) with the most values of ``axis`` (three at least)."""
    fixed = ["dataset", *[c for c in CELL_COLUMNS if c != axis]]
    best, best_key = None, None
    for key, group in ok.groupby(fixed, dropna=False):
        n_values = group[axis].nunique()
        n_full = int((group.groupby("strategy")[axis].nunique() >= 3).sum())
        score = (n_values, n_full, len(group))
        if n_values >= 3 and n_full >= 1 and (best is None or score > best):
            best, best_key = score, key
    if best_key is None:
        return None
    selected = pd.Series(True, index=ok.index)
    for c, v in zip(fixed, best_key, strict=True):
        selected &= (ok[c] == v) | (ok[c].isna() & pd.isna(v))
    return ok[selected]


def scaling_series(frame: pd.DataFrame) -> pd.DataFrame:
    """Runs of grids that vary one of d_e, d_s, b with everything else fixed (the longest such series per axis)."""
    ok = frame[frame.status == "ok"]
    out = []
    for axis in SIZES:
        series = _longest_series(ok, axis)
        if series is not None:
            out.append(series.assign(axis=axis, value=series[axis],
                                     t_best=[_fastest_repeat(r) for r in series.itertuples()]))
    return pd.concat(out) if out else pd.DataFrame()


def fit_exponent(x, y) -> float:
    """Least-squares slope of log y against log x."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    keep = (x > 0) & (y > 0) & np.isfinite(x) & np.isfinite(y)
    if keep.sum() < 2 or np.unique(x[keep]).size < 2:
        return math.nan
    return float(np.polyfit(np.log(x[keep]), np.log(y[keep]), 1)[0])


def _draw_scaling(series: pd.DataFrame, sizes: list[str], specs: list[str], names: dict[str, str]):
    """A log–log panel per size; returns the figure and the fitted exponents."""
    fig, axes = plt.subplots(1, len(sizes), figsize=(3.8 * len(sizes), 4.4), squeeze=False)
    axes = list(axes[0])
    colors = family_colors(specs)
    fits = []
    for ax, axis in zip(axes, sizes, strict=True):
        s = series[series.axis == axis]
        for spec in specs:
            ms = s[s.strategy == spec].groupby("value").t_best.median() * 1e3
            if len(ms) >= 2:
                fits.append(dict(axis=axis, strategy=spec, exponent=fit_exponent(ms.index, ms.values),
                                 points=len(ms)))
                ax.plot(ms.index, ms.values, "o-", color=colors[spec], label=plain_text(short_label(spec, names)))
        floor = s.groupby("value").t_floor.median() * 1e3
        if len(floor) >= 2:
            fits.append(dict(axis=axis, strategy="floor", exponent=fit_exponent(floor.index, floor.values),
                             points=len(floor)))
            ax.plot(floor.index, floor.values, "--", color=GREY, lw=1.2, label="floor, median")
        log_axis(ax, "x", base=2)
        log_axis(ax, "y")
        fixed = s.iloc[0]
        others = ", ".join(f"{c}={fixed[c]}" for c in ("d_s", "d_e", "b", "d_k", "p") if c != axis)
        ax.set_title(f"vary {axis}\n({plain_text(fixed.dataset)}, {others})", fontsize=MIN_FONT_PT + 0.5)
        ax.set_xlabel(f"{axis} (log scale)")
        ax.set_ylabel("fastest repeat of t_total (ms, log scale)")
    fig.suptitle("Scaling of growth time with d_e, d_s and b: time ∝ size^α, least squares on log–log",
                 fontweight="bold")
    bottom_legend(fig, axes, ncol=6, top=0.97)
    return fig, pd.DataFrame(fits, columns=["axis", "strategy", "exponent", "points"])


def _exponent_range(fits: pd.DataFrame, axis: str, names: dict[str, str]) -> str:
    """``d_e: α from 0.66 (default) to 1.52 (joint), floor 1.03``."""
    f = fits[(fits.axis == axis) & (fits.strategy != "floor")].dropna(subset=["exponent"]).sort_values("exponent")
    if f.empty:
        return ""
    floor = fits[(fits.axis == axis) & (fits.strategy == "floor")].exponent
    return (f"{axis}: α from {f.exponent.iloc[0]:.2f} ({short_label(f.strategy.iloc[0], names)}) to "
            f"{f.exponent.iloc[-1]:.2f} ({short_label(f.strategy.iloc[-1], names)})"
            + (f", floor {floor.iloc[0]:.2f}" if len(floor) and np.isfinite(floor.iloc[0]) else ""))


def _exponent_table(fits: pd.DataFrame, sizes: list[str], names: dict[str, str]) -> pd.DataFrame:
    """One row per strategy (the floor last), one column of fitted exponents per size, and the points per fit."""
    table = fits.pivot_table(index="strategy", columns="axis", values="exponent", aggfunc="first", sort=False)
    table = table.reindex(columns=sizes).rename(columns=lambda axis: f"α ({axis})")
    table["points per fit"] = fits.groupby("strategy", sort=False).points.max()
    table = table.reset_index()
    table["strategy"] = table.strategy.map(lambda s: s if s == "floor" else short_label(s, names))
    return table


def scaling(frame: pd.DataFrame) -> FigureResult:
    """Time against d_e, d_s, b on log–log axes with fitted exponents."""
    theme()
    title = "Scaling of growth time with d_e, d_s and b"
    series = scaling_series(frame)
    if series.empty:
        return FigureResult("scaling", title, note="No scaling grid (one of d_e, d_s, b taking three or more values "
                                                   "with everything else fixed) is in the database.")
    names = preset_names()
    sizes = [a for a in SIZES if a in set(series.axis)]
    specs = sorted(series.strategy.unique(), key=lambda s: (s not in names, short_label(s, names)))
    fig, fits = _draw_scaling(series, sizes, specs, names)
    ranges = [text for text in (_exponent_range(fits, axis, names) for axis in sizes) if text]
    n_points = int(fits.points.max()) if len(fits) else 0
    rough = (f"; each fit has at most {plural(n_points, 'point')} of one seed, so treat the exponents as rough, "
             "and where the floor (grey, the same work at each size for every strategy) jumps, the machine was busy"
             if n_points <= 4 else "")
    caption = ("Growth time (the fastest of each run's timed repeats, the least disturbed by other load) against each "
               "size, with the exponent α of a least-squares fit time ∝ size^α: near 0 the fixed costs (loss "
               "evaluations, Python overhead) dominate, near 1 or above the size-dependent algebra does. "
               + (("Fitted exponents: " + "; ".join(ranges) + rough + ".") if ranges else ""))
    return FigureResult("scaling", title, caption.strip(), fig, data=fits, table=_exponent_table(fits, sizes, names),
                        formats={f"α ({axis})": ".2f" for axis in sizes})


# ------------------------------------------------------------------ CPU vs GPU
def device_pairs(frame: pd.DataFrame) -> pd.DataFrame:
    """Median ``t_total`` on CPU and on CUDA of every configuration run on both, and the speed-up."""
    ok = frame[frame.status == "ok"]
    kinds = ok.device.fillna("").map(lambda d: d.split(":")[0])
    keys = ["strategy", "dataset", "seed", *[c for c in CELL_COLUMNS if c != "device"]]
    cpu = ok[kinds == "cpu"].groupby(keys, dropna=False).t_total.median()
    gpu = ok[kinds == "cuda"].groupby(keys, dropna=False).t_total.median()
    both = pd.concat([cpu.rename("cpu"), gpu.rename("gpu")], axis=1, join="inner").reset_index()
    return both.assign(speedup=both.cpu / both.gpu)


def devices(frame: pd.DataFrame) -> FigureResult:
    """Speed-up of GPU runs over CPU runs of otherwise equal configurations."""
    theme()
    title = "CPU against GPU"
    ok = frame[frame.status == "ok"]
    kinds = set(ok.device.fillna("").map(lambda d: d.split(":")[0]))
    if not {"cpu", "cuda"} <= kinds:
        have = ", ".join(sorted(set(ok.device.dropna()))) or "none"
        return FigureResult("devices", title, note=f"No GPU comparison: the database has successful runs on "
                                                   f"{have} only, not on both CPU and CUDA.")
    both = device_pairs(frame)
    if both.empty:
        return FigureResult("devices", title, note="The database has CPU and GPU runs, but no configuration was run "
                                                   "on both.")
    names = preset_names()
    both["label"] = both.strategy.map(lambda s: short_label(s, names))
    med = both.groupby("label").speedup.median().sort_values()
    order = med.index.tolist()
    fig, ax = plt.subplots(figsize=(9.5, 2.2 + 0.32 * len(order)))
    strip_plot(data=both, x="speedup", y="label", hue="dataset", order=order, ax=ax, orient="h", size=5,
               jitter=0.15, palette=dataset_colors(both.dataset), hue_order=sorted(both.dataset.unique()))
    ax.scatter(med.values, range(len(order)), marker="|", s=300, color=BLACK, lw=2, zorder=5, label="median")
    ax.set_yticks(range(len(order)), [plain_text(o) for o in order])
    ax.axvline(1, color=BLACK, ls="--", lw=0.8)
    log_axis(ax, "x")
    ax.set_xlabel("speed-up t_total(CPU) / t_total(GPU) (×, log scale)")
    ax.set_ylabel("")
    ax.get_legend().remove()
    fig.suptitle(title + ": speed-up of equal configurations", fontweight="bold")
    bottom_legend(fig, [ax], ncol=4, top=0.95)
    gpu_names = ", ".join(sorted(set(ok[ok.device.fillna("").str.startswith("cuda")].device_name.dropna()
                                     .astype(str)))) or "GPU"
    caption = (f"Each dot is one configuration run on both devices ({len(both)} in all, GPU {gpu_names}), the bar "
               f"the median per strategy. Median speed-up {both.speedup.median():.2g}× (from {med.iloc[0]:.2g}× for "
               f"{order[0]} to {med.iloc[-1]:.2g}× for {order[-1]}); {int((both.speedup < 1).sum())} configurations "
               "were slower on the GPU.")
    table = pd.DataFrame({"strategy": order, "median speed-up ×": med.to_numpy(),
                          "configurations": both.groupby("label").size().reindex(order).to_numpy()})
    return FigureResult("devices", title, caption, fig, data=both, table=table, formats={"median speed-up ×": ".2g"})
