"""The report's training section: medians, verdicts, figures, HTML/Markdown, training-only databases."""

from __future__ import annotations

import json
import statistics
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from growbench.harness.cli import main as cli_main
from growbench.harness.report.build import build_report
from growbench.harness.report.train_runs import (
    MAIN_METHODS,
    TABLE_COLUMNS,
    growth_steps,
    load_training,
    median_curves,
    prepare,
    training_table,
)
from growbench.harness.report.train_verdict import NEGATIVE, overall_text, verdicts
from growbench.harness.report.training import build_training
from growbench.harness.store.results import ResultsDB
from growbench.harness.store.training import TrainDB
from growbench.harness.train import TrainConfig

HOSTILE = "<script>alert('t')</script>"
STEPS, EVERY, GROW = 40, 10, 10
SIZES = dict(d_s=8, d_e=8, b=8, d_k0=2, d_k_max=8, p=2, grow_every=GROW, steps=STEPS, eval_every=EVERY)

# Final held-out loss and total FLOPs per (dataset, variant): one value per seed 0, 1, 2. Curves fall linearly
# from 3.0 to the final loss, FLOPs in proportion to the step.
# teacher: default reaches fixed-large's final loss (1.0) at 0.6× its FLOPs, and ends no higher than every baseline
# on every seed (equal to fixed-large on seed 0).
# text: default never reaches fixed-large's 2.0 (it ends at 2.04); gradmax and fixed-large end below it.
# digits: default ends 20% above fixed-large on every seed (with fewer FLOPs); it beats random, zero and gradmax.
FINALS = {
    ("teacher", "default"): [1.00, 0.90, 1.05], ("teacher", "fixed-large"): [1.00, 0.98, 1.10],
    ("teacher", "random"): [1.50, 1.40, 1.60], ("teacher", "zero"): [1.20, 1.60, 1.50],
    ("teacher", "gradmax"): [1.10, 1.05, 1.20], ("teacher", "fixed-small"): [2.0, 2.1, 2.2],
    ("text", "default"): [2.04, 2.00, 2.06], ("text", "fixed-large"): [2.00, 1.98, 2.01],
    ("text", "random"): [2.50, 2.40, 2.60], ("text", "zero"): [2.50, 2.40, 2.60],
    ("text", "gradmax"): [1.90, 1.95, 2.10],
    ("digits", "default"): [1.20, 1.21, 1.19], ("digits", "fixed-large"): [1.00, 1.01, 0.99],
    ("digits", "random"): [1.30, 1.30, 1.30], ("digits", "zero"): [1.30, 1.30, 1.30],
    ("digits", "gradmax"): [1.25, 1.25, 1.25],
}
FLOPS = {("teacher", "default"): [55, 60, 65], ("teacher", "fixed-large"): [100, 100, 100],
         ("text", "default"): [110, 120, 130], ("text", "fixed-large"): [100, 100, 100],
         ("digits", "default"): [80, 80, 80], ("digits", "fixed-large"): [100, 100, 100]}
GROWTH = {"default": [9, 10, 20], "random": [5, 5, 5], "zero": [5, 5, 5], "gradmax": [6, 6, 6]}
VARIANTS = {"default fixed": dict(scale_policy="fixed"), "default reset": dict(opt_state="reset"),
            "default h=2": dict(n_heads=2, d_k_max=4)}

_n = 0


def train_row(method: str, dataset: str, seed: int, final: float, flops: float, growth: float = 0.0, *,
              status: str = "ok", error: str | None = None, finished: str = "2026-01-01T00:01:00", **kw) -> dict:
    """One stored training run, its held-out curve falling linearly from 3.0 to ``final``."""
    global _n
    _n += 1
    cfg = TrainConfig(method=method, dataset=dataset, seed=seed, **{**SIZES, **kw})
    row = {**cfg.as_dict(), "key": f"{cfg.key('test')}-{_n}", "status": status, "error": error,
           "torch_version": "2.13.0+cpu", "device_name": "cpu", "threads": 1, "git_commit": "abc",
           "code_version": "test", "hostname": "h", "python": "3.11", "started_at": "2026-01-01T00:00:00",
           "finished_at": finished}
    if status != "ok":
        return row
    grows = cfg.grows and method != "fixed-large"
    width = [cfg.d_k_max] * cfg.n_heads if method != "fixed-small" else [cfg.d_k0] * cfg.n_heads
    # The growth's own held-out effect: the default's raises the held-out loss by 5 %, zero's leaves it.
    jump = {"default": 0.1, "zero": 0.0}.get(method)
    effect = {"heldout_before": 2.0, "heldout_after": 2.0 + jump} if jump is not None else {}
    events = [{"head": 0, "p": cfg.p, "d_k": cfg.d_k0 + cfg.p * (i + 1), "lam": 1.0, "loss_before": 2.0,
               "loss_after": 1.9, "step": s + 1, **effect} for i, s in enumerate(range(GROW, STEPS, GROW))] \
        if grows else []
    curve = [{"step": s, "wall_s": 0.01 * s, "flops": flops * s / STEPS,
              "train_loss": float("nan") if s == 0 else 3.0 + (final - 3.0) * s / STEPS,
              "heldout_loss": 3.0 + (final - 3.0) * s / STEPS, "d_k": width} for s in range(0, STEPS + 1, EVERY)]
    row.update(final_heldout=final, best_heldout=final, final_train=final, wall_s=0.01 * STEPS + seed,
               growth_wall_s=0.0, train_flops=flops - growth, growth_flops=growth, total_flops=flops,
               n_growths=len({e["step"] for e in events}), final_d_k=width, n_params=100, events=events, checks=[],
               curve=curve)
    return row


def fixture_rows() -> list[dict]:
    rows = []
    for (ds, method), finals in FINALS.items():
        for seed, final in enumerate(finals):
            flops = FLOPS.get((ds, method), [100, 100, 100])[seed]
            rows.append(train_row(method, ds, seed, final, flops, GROWTH.get(method, [0, 0, 0])[seed]))
    for seed in range(3):
        for variant, kw in VARIANTS.items():
            rows.append(train_row("default", "teacher", seed, 1.0 + 0.1 * (seed + 1) * len(variant) / 10, 100,
                                  10, **kw))
    # A failure, with a hostile message; and an older copy of a run (same configuration, another code version).
    rows.append(train_row("gradmax", "teacher", 3, 0, 0, status="failed", error=f"RuntimeError: boom {HOSTILE}\ntb"))
    rows.append(train_row("default", "teacher", 0, 100.0, 1e9, 10, finished="2025-01-01T00:00:00"))
    return rows


def write_train_db(path: Path, rows: list[dict]) -> Path:
    with TrainDB(path) as db:
        for r in rows:
            db.write(r)
    return path


@pytest.fixture(scope="module")
def fixture_db(tmp_path_factory) -> Path:
    return write_train_db(tmp_path_factory.mktemp("train") / "t.sqlite", fixture_rows())


@pytest.fixture(scope="module")
def section(fixture_db):
    runs, curves = load_training(fixture_db)
    return build_training(runs, curves, figures=False)


@pytest.fixture(scope="module")
def report(fixture_db, tmp_path_factory):
    out = tmp_path_factory.mktemp("train_out") / "rep"
    assert cli_main(["report", "--db", str(fixture_db), "--out", str(out)]) == 0
    return out


def _cell(table: pd.DataFrame, ds: str, variant: str) -> pd.Series:
    r = table[(table.dataset == ds) & (table.variant == variant)]
    assert len(r) == 1, (ds, variant)
    return r.iloc[0]


# ------------------------------------------------------------------ table and verdict
def test_table_medians_equal_hand_computed_medians(section):
    t = section.table
    for (ds, variant), finals in FINALS.items():
        row = _cell(t, ds, variant)
        assert row.final_heldout == pytest.approx(statistics.median(finals)), (ds, variant)
        flops = FLOPS.get((ds, variant), [100, 100, 100])
        assert row.total_flops == pytest.approx(statistics.median(flops))
        shares = [g / f for g, f in zip(GROWTH.get(variant, [0, 0, 0]), flops, strict=True)]
        assert row.growth_flops_share == pytest.approx(statistics.median(shares))
        assert row.seeds == 3
        assert row.wall_s == pytest.approx(0.01 * STEPS + 1)  # seeds 0, 1, 2 add 0, 1, 2 s
    # The superseded copy (final 100) does not count; the failure is counted apart from the seeds.
    assert _cell(t, "teacher", "default").final_heldout == pytest.approx(1.0)
    assert section.facts["superseded runs"].startswith("1 ")
    assert _cell(t, "teacher", "gradmax").failed == 1 and _cell(t, "text", "gradmax").failed == 0
    assert _cell(t, "teacher", "fixed-large").final_vs_fixed_large == pytest.approx(1.0)
    assert _cell(t, "digits", "default").final_vs_fixed_large == pytest.approx(1.2 / 1.0)
    assert _cell(t, "teacher", "default h=2").final_d_k == "4, 4" and _cell(t, "teacher", "default").final_d_k == "8"
    # Main methods first, in a fixed order; then the variants.
    order = list(t[t.dataset == "teacher"].variant)
    assert order[:6] == ["default", "random", "zero", "gradmax", "fixed-small", "fixed-large"]
    assert set(order[6:]) == set(VARIANTS)
    assert list(section.failed.error) == [f"RuntimeError: boom {HOSTILE}"]


def test_verdicts_reflect_the_numbers(section):
    v = {x.dataset: x for x in section.verdicts}
    assert set(v) == {"teacher", "text", "digits"}
    # teacher: the median curve (3 → 1.0 over 40 steps, median FLOPs 60) reaches fixed-large's 1.0 at its end.
    t = v["teacher"]
    assert t.matches_fixed_large is True and t.beats_baselines is True
    assert "(a) met: default growth reaches fixed-large's final held-out loss 1 at 60 FLOPs (×0.600" in t.text
    assert "(b) met: default ends no higher than every baseline on every seed" in t.text
    assert "gradmax 1.1 (default no higher on 3 of 3 seeds;" in t.text  # seed 3 of gradmax failed: 3 shared
    assert "fixed-large 1 (default no higher on 3 of 3 seeds;" in t.text  # seed 0: equal
    assert "default +5% over 9 growths, zero +0% over 9 growths" in t.text
    assert NEGATIVE not in t.text
    # text: never reaches 2.0; gradmax and fixed-large end lower on some seeds.
    x = v["text"]
    assert x.matches_fixed_large is False and x.beats_baselines is False
    assert "(a) NOT met: default growth never reaches fixed-large's final held-out loss 2 (its own final: 2.04" \
        in x.text
    assert "(b) NOT met: default ends above gradmax, fixed-large on some seed" in x.text and NEGATIVE in x.text
    # digits: 20 % above fixed-large on every seed.
    d = v["digits"]
    assert d.matches_fixed_large is False and d.beats_baselines is False
    assert d.numbers["loss_ratio"] == pytest.approx(1.2) and "fixed-large 1 (default no higher on 0 of 3" in d.text
    assert "default against it +20% [+19.5%, +20.5%], beyond seed noise" in d.text
    assert "met on 1 of 3 datasets" in overall_text(section.verdicts)
    # Variants enter the verdict as comparisons.
    assert "Adam state: median final held-out pad 1, reset" in t.text
    assert "Scale policy (default): median final held-out rescale 1, fixed" in t.text


def test_paired_change_is_scipys_t_interval_of_the_per_seed_ratios(section):
    """The change beside target (b)'s counts: mean of default / baseline − 1 over the shared seeds, with the 95 %
    interval of scipy's one-sample t test; within seed noise when it spans 0."""
    from scipy import stats

    judged = {v.dataset: v for v in section.verdicts}
    for ds, baseline in (("text", "gradmax"), ("teacher", "zero"), ("digits", "fixed-large")):
        ratios = [a / b - 1 for a, b in zip(FINALS[(ds, "default")], FINALS[(ds, baseline)], strict=True)]
        change = judged[ds].numbers[f"{baseline}_change"]
        low, high = stats.ttest_1samp(ratios, 0.0).confidence_interval(0.95)
        assert (change.mean, change.low, change.high, change.n) == pytest.approx(
            (statistics.mean(ratios), low, high, 3)), (ds, baseline)
    text = {x.dataset: x for x in section.verdicts}["text"].text
    assert "gradmax 1.95 (default no higher on 1 of 3 seeds; default against it +2.68% [" in text
    assert "within seed noise" in text.split("gradmax 1.95")[1].split(")")[0]


def test_advantage_along_training_is_the_paired_change_at_each_step(fixture_db, section):
    """default against zero at each evaluation step, from the stored curves (3 → final linearly, see train_row):
    scipy's t interval of the per-seed ratios; the verdict names the first evaluation after each growth."""
    from scipy import stats

    from growbench.harness.report.train_verdict import advantage_along

    _, curves = load_training(fixture_db)
    runs = prepare(section.runs)
    along = dict(advantage_along(runs, curves, "teacher"))
    assert sorted(along) == list(range(0, STEPS + 1, EVERY))
    assert along[0].mean == 0 and along[0].n == 3  # both start at 3.0
    for step in (20, STEPS):
        ratios = [(3 + (d - 3) * step / STEPS) / (3 + (z - 3) * step / STEPS) - 1
                  for d, z in zip(FINALS[("teacher", "default")], FINALS[("teacher", "zero")], strict=True)]
        low, high = stats.ttest_1samp(ratios, 0.0).confidence_interval(0.95)
        assert (along[step].mean, along[step].low, along[step].high) == pytest.approx(
            (statistics.mean(ratios), low, high))
    text = {x.dataset: x for x in section.verdicts}["teacher"].text
    assert "after the growth at step 10 (step 20): " in text and "after the growth at step 30 (step 40)" not in text
    assert f"at the end (step {STEPS}): {100 * along[STEPS].mean:+.3g}%" in text
    assert advantage_along(runs, curves, "teacher", baseline="no-such-method") == []


def test_advice_says_whether_a_baseline_that_ends_lower_does_so_beyond_seed_noise(section):
    from growbench.harness.report.advice import _training_exceptions

    lines = _training_exceptions(section)
    text = next(x for x in lines if x.startswith("when growing during training on text:"))
    assert "gradmax (1.95, within seed noise)" in text  # +7.4 %, +2.6 %, −1.9 % over the seeds
    digits = next(x for x in lines if x.startswith("when growing during training on digits:"))
    assert "fixed-large (1, beyond seed noise)" in digits  # +20 % on every seed


def test_advice_keeps_fixed_large_out_where_growth_ends_below_it(section):
    """Target (a) missed (fixed-large's final loss reached late) while default growth ends below fixed-large, as on
    the committed text runs: no advice to start at full width."""
    from growbench.harness.report.advice import _training_exceptions
    from growbench.harness.report.train_verdict import Verdict

    table = section.table.copy()
    late = Verdict("teacher", matches_fixed_large=False, beats_baselines=True, text="",
                   numbers={"flops_ratio": 0.76, "loss_ratio": 0.99})
    judged = SimpleNamespace(verdicts=[late], table=table, schedules=[])
    assert not [x for x in _training_exceptions(judged) if "full width" in x]
    table.loc[(table.dataset == "teacher") & (table.variant == "fixed-large"), "final_heldout"] = 0.5
    (line,) = _training_exceptions(judged)
    assert line == ("when the full width is affordable from the start on teacher: fixed-large; default growth "
                    "reaches its final held-out loss at ×0.76 of its FLOPs (target: reach it at ×0.7 of its FLOPs).")


def test_verdict_without_the_runs_it_needs_says_so():
    rows = [train_row("default", "teacher", s, 1.0, 100, 5) for s in range(2)]
    rows.append(train_row("random", "teacher", 0, 1.5, 100, 5))
    runs = prepare(pd.DataFrame([{k: (json.dumps(v) if isinstance(v, list) else v) for k, v in r.items()
                                    if k != "curve"} for r in rows]))
    (v,) = verdicts(runs)
    assert v.matches_fixed_large is None and "(a) not judged: no successful fixed-large run" in v.text
    assert v.beats_baselines is None and "zero, gradmax, fixed-small, fixed-large did not run" in v.text


def test_one_dataset_at_two_sizes_is_two_panels():
    rows = [train_row("default", "teacher", 0, 1.0, 90, 5), train_row("fixed-large", "teacher", 0, 2.0, 100),
            train_row("default", "teacher", 0, 3.0, 90, 5, d_e=16), train_row("fixed-large", "teacher", 0, 3.0, 100,
                                                                             d_e=16)]
    runs = prepare(pd.DataFrame([{k: (json.dumps(v) if isinstance(v, list) else v) for k, v in r.items()
                                    if k != "curve"} for r in rows]))
    t = training_table(runs)
    assert set(t.dataset) == {"teacher (d_e=8)", "teacher (d_e=16)"}  # medians never mix sizes
    assert _cell(t, "teacher (d_e=8)", "default").final_vs_fixed_large == pytest.approx(0.5)
    v = {x.dataset: x for x in verdicts(runs, t)}
    # Without curves target (a) cannot be judged; target (b) is judged per panel, on its own runs.
    assert v["teacher (d_e=8)"].matches_fixed_large is None and "no curve" in v["teacher (d_e=8)"].text
    assert "fixed-large 2 (default no higher on 1 of 1 seed; default against it -50% (one seed: no noise " \
        "estimate))" in v["teacher (d_e=8)"].text
    assert "fixed-large 3 (default no higher on 1 of 1 seed;" in v["teacher (d_e=16)"].text


def test_one_variant_at_two_schedules_is_two_panels_and_a_variant_of_its_own_schedule_is_not():
    once = dict(p=SIZES["d_k_max"] - SIZES["d_k0"], grow_every=1)
    rows = [train_row("default", "teacher", 0, 1.0, 90, 5), train_row("fixed-large", "teacher", 0, 2.0, 100),
            train_row("default", "teacher", 0, 0.5, 90, 5, **once),
            train_row("fixed-large", "teacher", 0, 2.0, 100, **once),
            # The bottleneck trigger's own grow_every belongs to its variant, as in the 'variants' preset.
            train_row("default", "teacher", 0, 1.5, 90, 5, trigger="bottleneck", grow_every=SIZES["grow_every"] // 2)]
    runs = prepare(pd.DataFrame([{k: (json.dumps(v) if isinstance(v, list) else v) for k, v in r.items()
                                  if k != "curve"} for r in rows]))
    staged = f"teacher (p={SIZES['p']}, grow_every={SIZES['grow_every']})"
    at_once = f"teacher (p={once['p']}, grow_every=1)"
    assert set(runs.panel) == {staged, at_once, f"teacher (p={SIZES['p']}, grow_every={SIZES['grow_every'] // 2})"}
    t = training_table(runs)
    assert _cell(t, staged, "default").final_vs_fixed_large == pytest.approx(0.5)
    assert _cell(t, at_once, "default").final_vs_fixed_large == pytest.approx(0.25)
    # Without the second schedule, the bottleneck variant shares the staged design's panel.
    alone = prepare(pd.DataFrame([{k: (json.dumps(v) if isinstance(v, list) else v) for k, v in r.items()
                                   if k != "curve"} for r in (rows[0], rows[1], rows[4])]))
    assert set(alone.panel) == {"teacher"}


def test_growth_steps_and_median_curves(section, fixture_db):
    runs = section.runs
    assert growth_steps(runs, "teacher") == [10, 20, 30]  # growths recorded at steps 11, 21, 31
    _, curves = load_training(fixture_db)
    med = median_curves(runs, curves)
    c = med[(med.panel == "teacher") & (med.variant == "default")].set_index("step")
    assert list(c.index) == [0, 10, 20, 30, 40] and (c.seeds == 3).all()
    assert c.loc[40, "heldout"] == pytest.approx(1.0) and c.loc[40, "lo"] == pytest.approx(0.9)
    assert c.loc[40, "flops"] == pytest.approx(60)


# ------------------------------------------------------------------ the report
class _Doc(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.imgs, self.links = [], [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        if tag == "img":
            self.imgs.append(a.get("src", ""))
        elif a.get("href"):
            self.links.append(a["href"])


def test_training_only_report_via_the_cli(report, section):
    for name in ("train_curves", "train_variants"):
        for ext in ("png", "svg"):
            f = report / "figures" / f"{name}.{ext}"
            assert f.is_file() and f.stat().st_size > 1000, f
    assert (report / "figures" / "train_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = (report / "report.html").read_text()
    md = (report / "report.md").read_text()
    for text in (html, md):
        assert "Growth during training" in text and "No growth-sweep section" in text
        assert "(a) NOT met" in text and "A target that is not met is reported as measured, not hidden." in text
    doc = _Doc()
    doc.feed(html)
    assert len(doc.imgs) == 2 and all(s.startswith("data:image/png;base64,") for s in doc.imgs)
    # The only links out of the page are to each figure's SVG beside it, for zooming (tests/test_figures.py).
    assert "script" not in doc.tags and all(h.startswith("#") or h in ("figures/train_curves.svg",
                                                                       "figures/train_variants.svg")
                                            for h in doc.links)
    assert "<script>" not in html and "&lt;script&gt;alert(" in html
    assert "<script>" not in md and "figures/train_curves.png" in md
    # training_summary.csv is the table; no growth-sweep files.
    csv = pd.read_csv(report / "training_summary.csv")
    assert list(csv.columns) == TABLE_COLUMNS and len(csv) == len(section.table)
    assert not (report / "summary.csv").exists() and not (report / "recommendation.json").exists()


def test_captions_are_computed_from_the_data(report):
    md = (report / "report.md").read_text()
    curves = md.split("### Growth during training: held-out loss of each method")[1].split("###")[0]
    variants = md.split("### Growth during training: variants")[1].split("###")[0]
    assert "teacher (3 seeds): final held-out loss default 1, random 1.5, zero 1.5, gradmax 1.1" in curves
    assert "default grew after steps 10, 20, 30" in curves and "d_k 2 → 8" in curves
    assert "lowest: fixed-large" in curves  # digits
    assert "Two heads: median final held-out default h=2" not in variants  # only one member: no group
    assert "default h=2: final held-out 1.22" in variants  # alone in its group: listed on its own
    assert "Adam state: median final held-out pad 1, reset 1.26; lowest: pad" in variants


def test_advice_names_where_growth_misses_its_targets(report):
    md = (report / "report.md").read_text()
    advice = md.split("## Advice", 1)[1].split("\n## ", 1)[0]
    # digits: 1.2 × fixed-large's loss; text: 1.02 × it, and gradmax below default (see FINALS, FLOPS).
    assert "when the full width is affordable from the start on digits: fixed-large; default growth ends at ×1.2 " \
        "its final held-out loss" in advice
    assert "from the start on text: fixed-large; default growth ends at ×1.02 its final held-out loss" in advice
    assert "on text: gradmax (1.95, within seed noise)" in advice
    assert "teacher" not in advice.split("What does not matter")[0]


def _growth_row(strategy: str, seed: int) -> dict:
    """A minimal successful growth-sweep row."""
    return dict(key=f"g{strategy}{seed}", status="ok", strategy=strategy, dataset="teacher", d_s=8, d_e=8, b=8,
                d_k=2, p=2, seed=seed, device="cpu", n_batches=2, repeats=1, warmup_steps=5, dtype="float32",
                scale_policy="rescale", optimality=0.9, first_order_decrease=0.1, loss_before=1.0, loss_after=0.9,
                loss_decrease=0.1, heldout_before=1.0, heldout_after=0.95, heldout_decrease=0.05, bottleneck=0.5,
                lam=1.0, n_loss_evals=4, fallback="", t_statistics=0.001, t_direction=0.001, t_truncation=0.001,
                t_line_search=0.001, t_total=0.005, t_floor=0.002, t_loss_eval=0.0005, peak_mem_bytes=1,
                peak_mem_method="x", extra={}, torch_version="2.13.0+cpu", device_name="cpu", threads=1,
                git_commit="abc", code_version="v1", hostname="h", python="3.11",
                started_at="2026-01-01T00:00:00", finished_at="2026-01-01T00:00:01")


def test_growth_sweep_report_gains_the_section(tmp_path):
    db = tmp_path / "both.sqlite"
    with ResultsDB(db) as g:
        for seed in (0, 1):
            g.write(_growth_row("default", seed))
            g.write(_growth_row("formula1", seed))
    write_train_db(db, [train_row(m, "teacher", s, 1.0 + 0.1 * i, 100, 5 if i < 4 else 0)
                        for s in (0, 1) for i, m in enumerate(MAIN_METHODS)])
    out = tmp_path / "out"
    done = build_report(db, out, svg=False)
    assert "train_curves" in done["figures"] and "pareto" in done["figures"]
    assert any("train_variants" in n for n in done["notes"])  # no variants: a note, not a figure
    html, md = (out / "report.html").read_text(), (out / "report.md").read_text()
    for text in (html, md):
        assert "Recommended default strategy" in text and "Growth during training" in text
        assert "No growth-sweep section" not in text
    assert 'href="#training"' in html and "(#growth-during-training)" in md
    for f in ("summary.csv", "recommendation.json", "training_summary.csv", "figures/train_curves.png"):
        assert (out / f).is_file(), f
    # The same folder, reused for a database without training runs: the training files are stale, removed.
    plain = tmp_path / "plain.sqlite"
    with ResultsDB(plain) as g:
        g.write(_growth_row("default", 0))
    build_report(plain, out, svg=False)
    assert not (out / "training_summary.csv").exists() and not (out / "figures" / "train_curves.png").exists()
    assert "Growth during training" not in (out / "report.html").read_text()


def test_databases_without_any_successful_run_still_exit_2(tmp_path, capsys):
    failed = write_train_db(tmp_path / "f.sqlite", [train_row("default", "teacher", 0, 0, 0, status="failed",
                                                              error="ValueError: bad")])
    assert cli_main(["report", "--db", str(failed), "--out", str(tmp_path / "o")]) == 2
    assert "no successful runs in" in capsys.readouterr().err
    empty = tmp_path / "e.sqlite"
    TrainDB(empty).close()
    assert cli_main(["report", "--db", str(empty), "--out", str(tmp_path / "o")]) == 2
    assert "no successful runs in" in capsys.readouterr().err


# ------------------------------------------------------------------ a real (tiny) training sweep
def test_report_of_a_tiny_real_training_sweep(tmp_path):
    from growbench.harness.runner.train_sweep import run_train_sweep

    tiny = dict(dataset="teacher", d_s=8, d_e=8, b=8, d_k0=2, d_k_max=4, p=2, grow_every=10, steps=30,
                eval_every=10)
    configs = [TrainConfig(method=m, **tiny) for m in ("default", "random", "fixed-large")]
    db = tmp_path / "t.sqlite"
    runs = run_train_sweep(configs, str(db), progress=False)
    assert (runs.status == "ok").all(), runs.error.tolist()
    done = build_report(db, tmp_path / "out", svg=False)
    assert done["figures"] == ["train_curves"]
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Growth during training" in md and "- **teacher**" in md
    (v,) = build_training(*load_training(db)).verdicts
    assert v.matches_fixed_large in (True, False) and "(a) " in v.text
    # zero, gradmax and fixed-small did not run: (b) is either missed on what ran, or not fully judged.
    assert (v.beats_baselines is None and "zero, gradmax, fixed-small did not run" in v.text) or \
        (v.beats_baselines is False and "(b) NOT met" in v.text)
    s = pd.read_csv(tmp_path / "out" / "training_summary.csv")
    assert set(s.variant) == {"default", "random", "fixed-large"} and (s.seeds == 1).all()


# ------------------------------------------------------------------ the real model's panel
def test_real_model_runs_are_a_panel_with_a_verdict_figures_and_tokens(tmp_path):
    real = dict(d_s=32, d_e=384, b=8, d_k0=4, d_k_max=16, p=4)
    spec = "minilm-recovery:narrow=layer"
    finals = {"default": 0.0024, "random": 0.0021, "zero": 0.0023, "gradmax": 0.0022, "fixed-small": 0.0030,
              "fixed-large": 0.0015}
    rows = [train_row(m, spec, 0, f, 100.0, 10.0 if m not in ("fixed-small", "fixed-large") else 0.0,
                      n_heads=1, **real) for m, f in finals.items()]
    for r in rows:  # every head of the narrowed layer: twelve widths per run
        r["final_d_k"] = r["final_d_k"] * 12
        r["curve"] = [{**c, "d_k": c["d_k"] * 12} for c in r["curve"]]
    rows += [train_row(m, "teacher", 0, 1.0, 100.0) for m in ("default", "fixed-large")]
    runs, curves = load_training(write_train_db(tmp_path / "t.sqlite", rows))
    s = build_training(runs, curves)
    assert spec in set(s.table.dataset)
    assert _cell(s.table, spec, "fixed-large").final_d_k == "16 ×12"
    v = {x.dataset: x for x in s.verdicts}[spec]
    assert v.matches_fixed_large is False and v.beats_baselines is False
    (curves_fig,) = [f for f in s.figures if f.name == "train_curves"]
    assert curves_fig.fig is not None and not curves_fig.note
    top = [c for ax in curves_fig.fig.axes for c in ax.child_axes if "tokens" in c.get_xlabel()]
    assert len(top) == 2  # one per panel: the real model's and teacher's
    assert any(d.startswith(spec) for d in curves_fig.details)
    med = median_curves(s.runs, curves)
    c = med[(med.panel == spec) & (med.variant == "default")]
    assert (c.tokens == c.step * 8 * 32).all()
    t = med[(med.panel == "teacher") & (med.variant == "default")]
    assert (t.tokens == t.step * SIZES["b"] * SIZES["d_s"]).all()


def test_the_regenerate_command_names_the_fewest_presets_whose_runs_are_the_databases():
    from growbench.harness.report.training import infer_train_preset
    from growbench.harness.runner.train_sweep import train_presets
    from growbench.harness.train import config_fields

    def frame(*names: str) -> pd.DataFrame:
        configs = [c for name in names for c in train_presets()[name]]
        return pd.DataFrame([c.as_dict() for c in configs])[config_fields()]

    assert infer_train_preset(frame("quick")) == ["quick"]
    assert infer_train_preset(frame("quick", "real")) == ["quick", "real"]
    assert infer_train_preset(frame("quick", "real", "real-once")) == ["quick", "real", "real-once"]
    # Runs that no preset holds (or only part of one) name none.
    assert infer_train_preset(frame("quick").iloc[1:]) is None


def test_two_schedules_compare_the_default_on_the_better_one_with_the_growers_on_the_other():
    from scipy import stats

    from growbench.harness.report.advice import _training_exceptions
    from growbench.harness.report.train_verdict import schedule_comparisons

    once = dict(p=SIZES["d_k_max"] - SIZES["d_k0"], grow_every=1)
    staged_default, once_default, staged_zero = [2.0, 2.2, 2.1], [1.5, 1.7, 1.7], [1.9, 2.3, 2.0]
    rows = []
    for seed in range(3):
        rows += [train_row("default", "teacher", seed, staged_default[seed], 90, 5),
                 train_row("zero", "teacher", seed, staged_zero[seed], 80, 1),
                 train_row("default", "teacher", seed, once_default[seed], 60, 5, **once)]
    runs = prepare(pd.DataFrame([{k: (json.dumps(v) if isinstance(v, list) else v) for k, v in r.items()
                                  if k != "curve"} for r in rows]))
    (c,) = schedule_comparisons(runs)
    staged = f"p={SIZES['p']}, grow_every={SIZES['grow_every']}"
    assert (c.schedule, c.other) == (f"p={once['p']}, grow_every=1", staged)
    assert set(c.changes) == {"default", "zero"} and c.wins["default"] == (3, 3)  # random did not run
    for method, there in (("default", staged_default), ("zero", staged_zero)):
        ratios = [a / b - 1 for a, b in zip(once_default, there, strict=True)]
        ci = stats.ttest_1samp(ratios, 0.0).confidence_interval(0.95)
        assert (c.changes[method].mean, c.changes[method].low, c.changes[method].high) == pytest.approx(
            (statistics.mean(ratios), ci.low, ci.high))
    assert c.flops == (60.0, 90.0) and f"median total FLOPs: 60 with {c.schedule}, 90 with {staged}." in c.text
    # The advice names the better schedule only where the default's own change is beyond seed noise.
    section = SimpleNamespace(verdicts=[], table=training_table(runs), schedules=[c])
    (line,) = _training_exceptions(section)
    assert line.startswith(f"when growing during training on teacher: grow with {c.schedule} rather than {c.other}")
    assert "beyond seed noise" in line and "×0.67 its FLOPs" in line
    measured = c.changes["default"]
    c.changes["default"] = type(measured)(measured.mean, measured.low, 0.01, measured.n)  # now spans 0
    assert _training_exceptions(section) == []


def test_the_training_facts_name_the_cpu_kernels_the_runs_recorded(tmp_path):
    """A host's kernels round float32 sums their own way: the facts say which made the training runs (none
    recorded: a dash)."""
    rows = [{**train_row("zero", "teacher", seed, 1.0, 100), "cpu_capability": kernels}
            for seed, kernels in enumerate(["AVX2", "AVX512", "AVX2"])]
    for path, stored, said in ((tmp_path / "k.sqlite", rows, "AVX2, AVX512"),
                               (tmp_path / "none.sqlite", [train_row("zero", "teacher", 0, 1.0, 100)], "–")):
        runs, curves = load_training(write_train_db(path, stored))
        assert build_training(runs, curves, figures=False).facts["cpu kernels"] == said
