"""Whether growth during training meets its two targets, per dataset, and how the variants compare.

Target (a): ``default`` growth reaches ``fixed-large``'s median final held-out loss within 5 %
with fewer median total FLOPs. Target (b): ``default``'s median final held-out loss is below
that of each of ``random``, ``zero`` and ``gradmax``. Both use the variants at default settings
(one head, ``rescale``, ``pad``, ``schedule``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from harness.report.train_runs import BASELINES, COMPARISONS, prepare, table_row, training_table
from harness.report.wording import four_digits, plural, ratio, three_digits

TOLERANCE = 0.05
NEGATIVE = "A target that is not met is reported as measured, not hidden."
# How each compared variant is called inside its group (the setting that differs).
SETTING_NAMES = {
    "scale policy (default)": {"default": "rescale", "default fixed": "fixed", "default learnable": "learnable"},
    "scale policy (fixed-large)": {"fixed-large": "rescale", "fixed-large fixed": "fixed",
                                   "fixed-large learnable": "learnable"},
    "Adam state": {"default": "pad", "default reset": "reset"},
    "trigger": {"default": "schedule", "default bottleneck": "bottleneck"},
}


@dataclass
class Verdict:
    """The verdict of one panel: ``None`` for a target that could not be judged (runs missing).

    ``text`` is ``parts`` (target (a), target (b), other comparisons, ...) joined; ``numbers`` holds the
    medians the targets were judged on.
    """

    dataset: str
    matches_fixed_large: bool | None
    beats_baselines: bool | None
    text: str
    numbers: dict = field(default_factory=dict)
    parts: list[str] = field(default_factory=list)


def _paired_wins(runs: pd.DataFrame, panel: str, a: str, b: str) -> tuple[int, int]:
    """Seeds where ``a``'s final held-out loss is below ``b``'s, and the seeds both ran successfully."""
    ok = runs[(runs.panel == panel) & (runs.status == "ok")]
    x = ok[ok.variant == a].groupby("seed").final_heldout.median()
    y = ok[ok.variant == b].groupby("seed").final_heldout.median()
    both = pd.concat([x.rename("a"), y.rename("b")], axis=1, join="inner")
    return int((both.a < both.b).sum()), len(both)


def measured_groups(table: pd.DataFrame, panel: str) -> list[tuple[str, list[tuple[str, pd.Series]]]]:
    """The comparison groups with two or more measured variants in ``panel``, with their table rows."""
    out = []
    for group, names in COMPARISONS:
        have = [(v, table_row(table, panel, v)) for v in names]
        have = [(v, r) for v, r in have if r is not None and math.isfinite(r.final_heldout)]
        if len(have) >= 2:
            out.append((group, have))
    return out


def comparison_text(table: pd.DataFrame, panel: str) -> list[str]:
    """One sentence per comparison group with two or more measured variants in ``panel`` (medians over seeds)."""
    out = []
    for group, have in measured_groups(table, panel):
        setting = SETTING_NAMES.get(group, {})
        parts = [f"{setting.get(v, v)} {four_digits(r.final_heldout)}" for v, r in have]
        best_v, best_r = min(have, key=lambda t: t[1].final_heldout)
        ref_v, ref_r = have[0]
        text = f"{group}: median final held-out {', '.join(parts)}; lowest: {setting.get(best_v, best_v)}"
        if best_v != ref_v:
            text += (f" ({100 * (best_r.final_heldout / ref_r.final_heldout - 1):+.2g}% vs "
                     f"{setting.get(ref_v, ref_v)})")
        if group == "trigger":
            text += (f"; growths {', '.join(f'{setting.get(v, v)} {four_digits(r.n_growths)}' for v, r in have)}, "
                     f"total FLOPs {', '.join(f'{setting.get(v, v)} {three_digits(r.total_flops)}' for v, r in have)}")
        out.append(text)
    return out


def _target_a(default: pd.Series | None, fixed_large: pd.Series | None, numbers: dict) -> tuple[bool | None, str]:
    """Target (a) and its sentence; fills ``numbers`` with the medians it was judged on."""
    if default is None or fixed_large is None:
        missing = " and ".join(v for v, r in (("default", default), ("fixed-large", fixed_large)) if r is None)
        return None, f"(a) not judged: no successful {missing} run."
    loss_ratio = default.final_heldout / fixed_large.final_heldout
    flops_ratio = default.total_flops / fixed_large.total_flops
    loss_ok = bool(default.final_heldout <= (1 + TOLERANCE) * fixed_large.final_heldout)
    flops_ok = bool(default.total_flops < fixed_large.total_flops)
    numbers.update(default_final=default.final_heldout, fixed_large_final=fixed_large.final_heldout,
                   loss_ratio=loss_ratio, default_flops=default.total_flops, fixed_large_flops=fixed_large.total_flops,
                   flops_ratio=flops_ratio)
    loss = (f"final held-out loss {four_digits(default.final_heldout)} against fixed-large's "
            f"{four_digits(fixed_large.final_heldout)} (×{ratio(loss_ratio)}; target ≤ ×{1 + TOLERANCE:.2f})")
    flops = (f"total FLOPs {three_digits(default.total_flops)} against {three_digits(fixed_large.total_flops)} "
             f"(×{ratio(flops_ratio)})")
    if loss_ok and flops_ok:
        return True, (f"(a) met: default growth reaches fixed-large's loss within 5% with fewer FLOPs: {loss}, "
                      f"{flops}.")
    why = ("comes within 5% of fixed-large's loss, but with more FLOPs" if loss_ok else
           "does not come within 5% of fixed-large's loss (with fewer FLOPs)" if flops_ok else
           "does not come within 5% of fixed-large's loss and uses more FLOPs")
    return False, f"(a) NOT met: default growth {why}: {loss}, {flops}."


def _target_b(runs: pd.DataFrame, table: pd.DataFrame, panel: str, default: pd.Series | None,
              numbers: dict) -> tuple[bool | None, str]:
    """Target (b) and its sentence; fills ``numbers`` with the baselines' medians."""
    if default is None:
        return None, "(b) not judged: no successful default run."
    measured = {v: r for v in BASELINES if (r := table_row(table, panel, v)) is not None}
    missing = [v for v in BASELINES if v not in measured]
    if not measured:
        return None, "(b) not judged: no successful random, zero or gradmax run."
    parts = []
    for v, r in measured.items():
        wins, n = _paired_wins(runs, panel, "default", v)
        parts.append(f"{v} {four_digits(r.final_heldout)} (default lower on {wins} of {plural(n, 'seed')})")
        numbers[f"{v}_final"] = r.final_heldout
    sizes = {v: r.final_d_k for v, r in measured.items() if r.final_d_k != default.final_d_k}
    size = (f"at equal final size (d_k {default.final_d_k})" if not sizes else
            f"at UNEQUAL final size (default d_k {default.final_d_k}; "
            + ", ".join(f"{v} {s}" for v, s in sizes.items()) + ")")
    lost = [v for v, r in measured.items() if not default.final_heldout < r.final_heldout]
    met: bool | None = None
    if lost:
        met = False
        head = f"(b) NOT met: default does not beat {', '.join(lost)}"
        head += f" ({', '.join(missing)} did not run)" if missing else ""
    elif sizes:
        head = "(b) not judged: default has the lower loss, but the final sizes differ"
    elif missing:
        head = (f"(b) not fully judged: default beats the {len(measured)} measured, but "
                f"{', '.join(missing)} did not run")
    else:
        met = True
        head = "(b) met: default beats random, zero and gradmax"
    return met, (f"{head} {size}: median final held-out loss default {four_digits(default.final_heldout)}, "
                 + ", ".join(parts) + ".")


def panel_verdict(runs: pd.DataFrame, table: pd.DataFrame, panel: str) -> Verdict:
    """Judge ``default`` growth on one panel against targets (a) and (b) (see the module docstring)."""
    default, fixed_large = table_row(table, panel, "default"), table_row(table, panel, "fixed-large")
    numbers: dict = {}
    a, text_a = _target_a(default, fixed_large, numbers)
    b, text_b = _target_b(runs, table, panel, default, numbers)
    parts = [text_a, text_b] + [f"{t[0].upper()}{t[1:]}." for t in comparison_text(table, panel)]
    if a is False or b is False:
        parts.append(NEGATIVE)
    return Verdict(panel, a, b, " ".join(parts), numbers, parts)


def verdicts(runs: pd.DataFrame, table: pd.DataFrame | None = None) -> list[Verdict]:
    """One :func:`panel_verdict` per panel of ``runs``."""
    if runs.empty:
        return []
    if "panel" not in runs:
        runs = prepare(runs)
    table = training_table(runs) if table is None else table
    return [panel_verdict(runs, table, p) for p in sorted(runs.panel.unique())]


def overall_text(judged: list[Verdict]) -> str:
    """One sentence counting the panels where each target was met."""
    def count(attr: str) -> str:
        values = [getattr(v, attr) for v in judged if getattr(v, attr) is not None]
        return f"{sum(values)} of {plural(len(values), 'dataset')}"

    return (f"Target (a), default growth within 5% of fixed-large's final held-out loss with fewer FLOPs: met on "
            f"{count('matches_fixed_large')}. Target (b), default below random, zero and gradmax at equal final "
            f"size: met on {count('beats_baselines')}.")
