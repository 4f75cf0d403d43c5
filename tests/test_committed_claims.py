"""Every claim of the committed recommendation holds on the per-seed runs it comes from (issue 26, item 3).

Each committed sweep (``reports/runs.csv``, the CPU reference; ``reports/cuda/runs.csv``, the GPU's) is read back,
and each regime's claims in the ``recommendation.json`` beside it are recomputed independently of
:mod:`harness.recommend`:
means and intervals with scipy's t-tests, the best by plain pandas, the per-seed verdicts
from each run's own standard error.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from scipy import stats

ROOT = Path(__file__).resolve().parent.parent


#: The committed reports and how many (regime, dataset) claims each has at least.
COMMITTED = {"reports": 4, "reports/cuda": 4}


@pytest.fixture(scope="module", params=list(COMMITTED))
def committed(request):
    folder = ROOT / request.param
    runs = pd.read_csv(folder / "runs.csv")
    runs = runs[runs.status == "ok"].assign(gain=lambda d: d.heldout_decrease / d.heldout_before)
    return runs, json.loads((folder / "recommendation.json").read_text()), COMMITTED[request.param]


def _reference(runs: pd.DataFrame, dataset: str, description: str) -> pd.DataFrame:
    """The runs of ``dataset`` in the reference configuration that ``description`` names (``dataset`` may be
    "teacher @ d_e=768", one of a dataset's tied configurations)."""
    sizes = dict(re.findall(r"(\w+)=(\d+)", description.split(" on ")[0]))
    device = description.split(" on ")[1].split(",")[0]
    sel = (runs.dataset == dataset.split(" @ ")[0]) & (runs.device == device)
    for key, value in sizes.items():
        sel &= runs[key] == int(value)
    return runs[sel]


def _interval(values) -> tuple[float, float, float]:
    values = np.asarray(values, dtype=float)
    ci = stats.ttest_1samp(values, 0.0).confidence_interval(0.95)
    return float(values.mean()), float(ci.low), float(ci.high)


def _per_seed(ref: pd.DataFrame, strategy: str) -> pd.Series:
    return ref[ref.strategy == strategy].set_index("seed").gain.sort_index()


def test_every_claim_of_the_committed_recommendation_holds_on_its_runs(committed):
    runs, data, at_least = committed
    checked = 0
    for key, entry in data["regimes"].items():
        eligible = [r["strategy"] for r in entry["table"] if r["eligible"]]
        tolerance = entry["tolerance"]
        for dataset, description in entry["reference_configurations"].items():
            ref = _reference(runs, dataset, description)
            mine = _per_seed(ref, entry["spec"])
            claim = entry["evidence"][dataset]
            mean, low, high = _interval(mine)
            assert claim["heldout_gain"][:3] == pytest.approx([mean, low, high], rel=1e-9, abs=1e-12), (key, dataset)
            assert claim["lowers"] == (low > 0), (key, dataset)
            # The best is the eligible strategy with the highest mean gain.
            means = {s: _per_seed(ref, s).mean() for s in eligible}
            assert claim["best_heldout_gain"] == pytest.approx(max(means.values()), rel=1e-12), (key, dataset)
            best = _per_seed(ref, claim["best_strategy"])
            diffs = (mine - best).dropna()
            if (diffs == 0).all():
                assert claim["within"], (key, dataset)
            else:
                d_mean, d_low, _ = _interval(diffs)
                assert claim["within"] == (d_low >= -tolerance * abs(best.mean())), (key, dataset)
            # Seeds on which the choice lowered or raised the held-out loss beyond its run's own noise.
            rows = ref[ref.strategy == entry["spec"]]
            bound = stats.t.ppf(0.975, rows.heldout_batches - 1) * rows.heldout_decrease_se / rows.heldout_before
            assert (claim["seeds_lowered"], claim["seeds_raised"]) == (int((rows.gain > bound).sum()),
                                                                        int((rows.gain < -bound).sum()))
            checked += 1
        # The verdict: a strategy that lowers the held-out loss on every dataset exists exactly when it says so.
        lowers_everywhere = [s for s in eligible
                             if all(_interval(_per_seed(_reference(runs, ds, desc), s))[1] > 0
                                    for ds, desc in entry["reference_configurations"].items())]
        assert entry["generalises"] == bool(lowers_everywhere), key
        if entry["verdict"] == "generalises":
            assert all(e["lowers"] and e["within"] for e in entry["evidence"].values() if isinstance(e, dict)), key
    assert checked >= at_least


# ------------------------------------------------------------------ the report's plain answers (issue 38, item 2)
def test_every_plain_answer_holds_on_its_per_seed_runs(committed):
    """The report opens with one answer per kind of data: grow or not, by how much, how sure. Each number of each
    answer is the default's mean held-out gain over seeds with its 95 % t interval, recomputed here from the runs;
    each verdict follows from those intervals; every dataset is answered once, under its own kind."""
    from growbench.datasets.registry import DATASETS
    from growbench.harness.report.answers import DO_NOT_GROW, GROW, GROW_WHERE_SHOWN, NO_EVIDENCE, plain_answers

    runs, data, _ = committed
    recs = {key: SimpleNamespace(regime=key, spec=entry["spec"], evidence=entry["evidence"])
            for key, entry in data["regimes"].items()}
    answers = plain_answers(recs)
    answered = [(c.regime, c.dataset) for a in answers for c in a.claims]
    assert sorted(answered) == sorted((key, ds) for key, entry in data["regimes"].items()
                                      for ds in entry["reference_configurations"])
    for answer in answers:
        lows, highs = [], []
        for claim in answer.claims:
            entry = data["regimes"][claim.regime]
            assert claim.spec == entry["spec"]
            gains = _per_seed(_reference(runs, claim.dataset, entry["reference_configurations"][claim.dataset]),
                              claim.spec)
            mean, low, high = _interval(gains)
            assert (claim.mean, claim.low, claim.high) == pytest.approx((mean, low, high), rel=1e-9, abs=1e-12)
            assert claim.seeds == len(gains)
            # The sentence says these numbers, in % of the held-out loss.
            fmt = ".3g" if low > 0 else "+.3g"
            assert f"{claim.dataset} " in answer.text()
            assert f"{100 * mean:{fmt}}% [{100 * low:{fmt}}, {100 * high:{fmt}}] over {len(gains)} seeds" \
                in answer.text(), (answer.label, claim.dataset)
            lows.append(low)
            highs.append(high)
            cls = DATASETS[claim.dataset.split(" @ ")[0].split(":")[0]]
            assert answer.kind.split(":")[0] == cls.kind
            if cls.kind == "pretrained":
                assert cls.task in answer.label and cls.model_name in answer.label
        expected = (DO_NOT_GROW if any(h < 0 for h in highs) else GROW if all(lo > 0 for lo in lows) else
                    GROW_WHERE_SHOWN if any(lo > 0 for lo in lows) else NO_EVIDENCE)
        assert answer.verdict == expected, answer.label


def test_the_h200_scale_sets_per_seed_table_is_its_runs():
    """docs/results.md's per-seed held-out gains at d_e = 4096 (the third GPU lease) and the interval it quotes are
    those of the lease's committed runs."""
    runs = pd.read_csv(ROOT / "reports/cuda/h200-2026-11-27/runs.csv")
    runs = runs[(runs.status == "ok") & (runs.d_e == 4096)]
    gain = (100 * runs.heldout_decrease / runs.heldout_before).groupby([runs.strategy, runs.seed]).first()
    text = (ROOT / "docs/results.md").read_text()
    table = text.split("| strategy at d_e = 4096 | seed 0 | seed 1 |\n")[1].split("\n\n")[0]
    rows = re.findall(r"^\| `([^`]+)`[^|]* \| ([^|]+) \| ([^|]+) \|$", table, flags=re.M)
    assert {spec for spec, *_ in rows} == set(gain.index.get_level_values(0))
    for spec, *cells in rows:
        for seed, cell in enumerate(cells):
            quoted = 0.0 if cell.strip().startswith("0 (no step)") else float(cell)
            assert gain[spec, seed] == pytest.approx(quoted, abs=5e-4), (spec, seed)
    mean, low, high = _interval(gain["gram/ridge/rsvd+metric/normal:bracket"])
    assert f"+{mean:.3f} % [{low:.3f}, +{high:.3f}]".replace("-", "−") in text


FOURTH_LEASE = ROOT / "reports/cuda/h200-2026-11-28"


def _fourth_lease_section() -> str:
    text = (ROOT / "docs/results.md").read_text()
    return text.split("## The GPU lease of the eleventh stop")[1].split("\n## ")[0]


def _gain_percent(runs: pd.DataFrame) -> pd.Series:
    return 100 * runs.heldout_decrease / runs.heldout_before


def test_the_fourth_leases_per_seed_table_and_the_cuda_large_choice_are_their_runs():
    """The per-seed held-out gains at d_e = 4096 that docs/results.md quotes for the fourth lease (seeds 0 and 1 from
    the third lease's runs, seed 2 from the fourth's), the choice's interval over the three seeds, and
    default.json's and the GPU report's cuda/large entry, all recomputed from the committed runs."""
    runs = pd.concat([pd.read_csv(ROOT / "reports/cuda/h200-2026-11-27/runs.csv"),
                      pd.read_csv(FOURTH_LEASE / "runs.csv")])
    runs = runs[(runs.status == "ok") & (runs.d_e == 4096)]
    gain = _gain_percent(runs).groupby([runs.strategy, runs.seed]).first()
    section = _fourth_lease_section()
    table = section.split("| strategy at d_e = 4096 | seed 0 | seed 1 | seed 2 |\n")[1].split("\n\n")[0]
    rows = re.findall(r"^\| `([^`]+)`([^|]*) \| ([^|]+) \| ([^|]+) \| ([^|]+) \|$", table, flags=re.M)
    assert len(rows) == 4
    for spec, _, *cells in rows:
        for seed, cell in enumerate(cells):
            quoted = 0.0 if cell.strip().startswith("0 (no step)") else float(cell)
            assert gain[spec, seed] == pytest.approx(quoted, abs=5e-4), (spec, seed)
    (choice,) = [spec for spec, note, *_ in rows if "(the choice)" in note]
    mean, low, high = _interval(gain[choice])
    assert low > 0 and f"{mean:+.3f} % [{low:+.3f}, {high:+.3f}]" in section
    for file in (ROOT / "strategies/default.json", ROOT / "reports/cuda/recommendation.json"):
        entry = json.loads(file.read_text())["regimes"]["cuda/large"]
        assert entry["spec"] == choice and entry["generalises"] and not entry["fallback"], file
        quoted = entry["evidence"]["teacher:device_draw=true"]["heldout_gain"][:3]
        assert quoted == pytest.approx([mean / 100, low / 100, high / 100], rel=1e-9), file


def test_the_fourth_leases_repeated_runs_agree_with_the_second_leases_as_quoted():
    """The fourth lease's runs that repeat a run of the GPU report (same strategy, configuration and seed): as many
    as docs/results.md says, their held-out gains within the points it quotes, its largest gap the pair it names."""
    config = ["strategy", "dataset", "d_s", "d_e", "b", "d_k", "p", "seed", "n_batches", "repeats", "warmup_steps"]
    lease = pd.read_csv(FOURTH_LEASE / "runs.csv")
    report = pd.read_csv(ROOT / "reports/cuda/runs.csv")
    report = report[~report.key.isin(lease.key)]  # the report holds the lease's d_e = 4096 runs too
    pairs = lease.assign(gain=_gain_percent(lease)).merge(report.assign(gain=_gain_percent(report)), on=config,
                                                          suffixes=("_new", "_old"))
    gap = (pairs.gain_new - pairs.gain_old).abs()
    section = _fourth_lease_section()
    count = int(re.search(r"Of these, (\d+) repeat a run of the second lease", section).group(1))
    within = float(re.search(r"agree within ([0-9.]+) points", section).group(1))
    assert len(pairs) == count and gap.max() <= within < gap.max() + 0.001
    worst = pairs.loc[gap.idxmax()]
    flag = worst.strategy.split(":")[0].split("+")[-1]
    assert (f"`+{flag}`'s bracket at {worst.d_e}, {worst.gain_old:.3f} % → {worst.gain_new:.3f} %"
            in " ".join(section.split()))
    assert set(pairs.device_name_old) == {"NVIDIA H100 80GB HBM3"} and set(pairs.device_name_new) == {"NVIDIA H200"}


def test_the_fourth_leases_targets_table_is_its_output():
    """Each row of the GPU targets table in docs/results.md (the default's time and multiple of its floor) is a line
    of the lease's raw output."""
    raw = (FOURTH_LEASE / "targets.md").read_text()
    table = _fourth_lease_section().split("| d_e | default | its floor |")[1].split("\n\n")[0]
    rows = re.findall(r"^\| (\d+)( \(targets' batch\))? \| ([0-9.]+) ms \| ([0-9.]+) ms \| \*\*([0-9.]+)×\*\* \|",
                      table, flags=re.M)
    assert len(rows) == 7
    for d_e, batch, ms, _, times in rows:
        if batch:
            line = re.search(rf"\| d_e={d_e}: default ≤ 3× its floor \| (?P<x>[0-9.]+)× \((?P<ms>[0-9.]+) ms", raw)
        else:
            line = re.search(rf"d_e={d_e} default: (?P<ms>[0-9.]+) ms \((?P<x>[0-9.]+)× floor\)", raw)
        assert (round(float(line["x"]), 1), float(line["ms"])) == (float(times), float(ms)), d_e


def _written(text: str, value: float) -> bool:
    """Whether ``value`` rounds to ``text`` at the decimals ``text`` is written with."""
    decimals = len(text.split(".")[1]) if "." in text else 0
    return round(value, decimals) == float(text)


def _results_section(heading: str) -> str:
    """The section of docs/results.md that begins with ``heading``, up to the next section."""
    return (ROOT / "docs/results.md").read_text().split(heading)[1].split("\n## ")[0]


def _check_targets_table(raw_file: str, section_heading: str, header: str) -> None:
    """A CPU targets table of docs/results.md (its "this run" column) against the committed raw output of that
    ``growbench targets`` run: the targets' own batch from its target lines, the scale part from its table."""
    raw = (ROOT / raw_file).read_text()
    table = _results_section(section_heading).split(header)[1].split("\n\n")[0]
    own = re.findall(r"^\| d_e = (\d+) \| [^|]+ \| \*\*([0-9.]+)×\*\* \(([0-9.]+) against ([0-9.]+) ms", table, re.M)
    scale = re.findall(r"^\| scale part, d_e = (\d+) \| [^|]+ \| (?:\*\*)?([0-9.]+)×(?:\*\*)? \(([0-9.]+) ms; floor "
                       r"([0-9.]+) ms", table, re.M)
    assert len(own) == 2 and len(scale) == 4
    for d_e, x, ms, floor in own:
        line = re.search(rf"\| d_e={d_e}: default ≤ 3× its floor \| {re.escape(x)}× \({re.escape(ms)} ms vs "
                         rf"{re.escape(floor)} ms\)", raw)
        assert line is not None, d_e
    rows = {int(m[0]): m[1:] for m in re.findall(r"^\s*(\d+)\s+default\s+(\S+)\s+(\S+)\s+(\S+)", raw, re.M)}
    for d_e, x, ms, floor in scale:
        t_total, t_floor, x_floor = map(float, rows[int(d_e)])
        assert _written(ms, t_total) and _written(floor, t_floor) and _written(x, x_floor), d_e


def test_the_twelfth_stops_cpu_targets_table_is_its_output():
    _check_targets_table("reports/targets/cpu-2026-11-28.md", "## The split-half sums without a product",
                         "| | the tenth stop | this run | target 3× |")


def test_the_fifteenth_stops_cpu_targets_table_is_its_output():
    _check_targets_table("reports/targets/cpu-2026-11-28-af1f22f.md",
                         "## `growbench targets` on the truncated path's slope",
                         "| | the twelfth stop's run | this run | target 3× |")


#: The sixteenth stop's section of docs/results.md.
SIXTEENTH = "## `+holdout` at d_e = 64: what a growth must pay"


def test_the_sixteenth_stops_capped_search_table_is_its_paired_runs():
    """docs/results.md's table of ``+holdout`` searches capped at 2 and 1 trials against the paired runs it was
    computed from, whose committed side is the committed sweep's own (held-out gain, loss calls and λ by key)."""
    paired = pd.read_csv(ROOT / "reports/holdout-trials/paired.csv")
    runs = pd.read_csv(ROOT / "reports/runs.csv", low_memory=False).set_index("key").loc[paired.key]
    assert len(paired) == 137 and paired.key.is_unique
    assert np.array_equal(runs.heldout_decrease / runs.heldout_before, paired.heldout_gain_committed.to_numpy())
    assert np.array_equal(runs.n_loss_evals, paired.n_loss_evals_committed)
    assert np.array_equal(runs.lam, paired.lam_committed)
    section = _results_section(SIXTEENTH)
    table = section.split("| `+holdout` searches | loss calls (137 runs) |")[1].split("\n\n")[0]
    committed = re.search(r"^\| as committed \(at most 12 trials\) \| (\d+) \|", table, re.M)
    assert int(committed[1]) == paired.n_loss_evals_committed.sum()
    for cap, label in (("cap2", "at most 2 trials"), ("cap1", "1 trial")):
        row = re.search(rf"^\| {label} \| (\d+) \| (\d+) \| (\S+) \[(\S+), (\S+)\] \|$", table, re.M)
        assert row is not None, label
        assert int(row[1]) == paired[f"n_loss_evals_{cap}"].sum()
        assert int(row[2]) == (paired[f"lam_{cap}"] != paired.lam_committed).sum()
        quoted = [float(x) for x in row.group(3, 4, 5)]
        computed = _interval((paired[f"heldout_gain_{cap}"] - paired.heldout_gain_committed).to_numpy())
        assert quoted == pytest.approx(computed, rel=5e-3), label
    # The default's paired differences per dataset, on the reference configuration the rule reads, seed by seed.
    default = paired[(paired.strategy == "gram/ridge/full+metric/normal+holdout+shrink:bracket")
                     & (paired.n_batches == 4) & (paired.repeats == 3)]
    bullet = section.split("- Two trials keep the held-out gain:")[1].split("\n- ")[0]
    for dataset, rows in default.groupby("dataset"):
        per_seed = rows.groupby("seed")[["heldout_gain_committed", "heldout_gain_cap2"]].median()
        assert len(per_seed) == 8
        found = re.search(rf"{dataset}\s+(\S+)\s+\[(\S+),\s+(\S+)\]", bullet)
        assert found is not None, dataset
        computed = _interval((per_seed.heldout_gain_cap2 - per_seed.heldout_gain_committed).to_numpy())
        assert [float(x) for x in found.groups()] == pytest.approx(computed, rel=5e-3), dataset


def test_the_sixteenth_stops_capped_sweep_changes_both_cpu_choices():
    """docs/results.md's table of what the rule names on the capped sweep: the rule's own code on the committed runs
    with the ``+holdout`` rows' held-out decreases those of the capped search (every other run of that sweep was the
    committed one bit for bit)."""
    from growbench.harness.rule.choice import recommend_regimes

    runs = pd.read_csv(ROOT / "reports/runs.csv", low_memory=False)
    paired = pd.read_csv(ROOT / "reports/holdout-trials/paired.csv").set_index("key")
    capped = runs.copy()
    rows = capped.key.isin(paired.index)
    assert rows.sum() == len(paired)
    gains = paired.loc[capped.key[rows], "heldout_gain_cap2"].to_numpy()
    capped.loc[rows, "heldout_decrease"] = gains * capped.loc[rows, "heldout_before"].to_numpy()
    section = _results_section(SIXTEENTH)
    table = section.split("| regime | committed choice | on the capped sweep | why |")[1].split("\n\n")[0]
    quoted = dict(re.findall(r"^\| cpu, (d_e ≤ 128|128 < d_e ≤ 1024) \| `[^`]+` \| `([^`]+)` \|", table, re.M))
    before, after = recommend_regimes(runs), recommend_regimes(capped)
    committed = dict(re.findall(r"^\| cpu, (d_e ≤ 128|128 < d_e ≤ 1024) \| `([^`]+)` \|", table, re.M))
    for regime, band in (("cpu/small", "d_e ≤ 128"), ("cpu/medium", "128 < d_e ≤ 1024")):
        assert before[regime].spec == committed[band] and after[regime].spec == quoted[band], regime
    small = "d_e ≤ 128"
    gains = re.search(r"falls from ([0-9.]+) to ([0-9.]+), under `\+shrink\+damp`'s ([0-9.]+)", table)
    worst_before = before["cpu/small"].table.set_index("strategy").worst_dataset_gain
    worst_after = after["cpu/small"].table.set_index("strategy").worst_dataset_gain
    assert _written(gains[1], worst_before[committed[small]]) and _written(gains[2], worst_after[committed[small]])
    assert _written(gains[3], worst_after[quoted[small]])


def test_the_sixteenth_stops_text_seeds_table_is_its_runs():
    """docs/results.md's table of the default on text with 32 seeds, committed code and capped search, against the
    per-seed gains, whose first 8 seeds are those of the committed sweep and of the capped one."""
    seeds = pd.read_csv(ROOT / "reports/holdout-trials/text-32-seeds.csv").sort_values("seed")
    paired = pd.read_csv(ROOT / "reports/holdout-trials/paired.csv")
    sweep = paired[(paired.dataset == "text") & (paired.n_batches == 4)
                   & (paired.strategy == "gram/ridge/full+metric/normal+holdout+shrink:bracket")].sort_values("seed")
    assert list(seeds.seed) == list(range(32)) and list(sweep.seed) == list(range(8))
    assert np.array_equal(seeds.heldout_gain_committed_code[:8], sweep.heldout_gain_committed)
    assert np.array_equal(seeds.heldout_gain_cap2[:8], sweep.heldout_gain_cap2)
    section = _results_section(SIXTEENTH).split("**Text with 32 seeds.**")[1]
    table = section.split("| seeds | held-out gain, committed code | capped at 2 trials | paired difference |")[1]
    table = table.split("\n\n")[0]
    interval = r"(\S+) \[(\S+), (\S+)\]"
    for label, n in (("0–7 \\(the sweep's\\)", 8), ("0–31", 32)):
        row = re.search(rf"^\| {label} \| {interval} \| {interval} \| {interval} \|$", table, re.M)
        assert row is not None, label
        first = seeds[seeds.seed < n]
        base, capped = first.heldout_gain_committed_code.to_numpy(), first.heldout_gain_cap2.to_numpy()
        computed = [*_interval(base), *_interval(capped), *_interval(capped - base)]
        assert [float(x) for x in row.groups()] == pytest.approx(computed, rel=5e-3), label


def test_the_sixteenth_stops_cpu_targets_table_is_its_output():
    _check_targets_table("reports/targets/cpu-2026-11-28-d31221e.md",
                         SIXTEENTH,
                         "| | the fifteenth stop's run | this run | target 3× |")


def test_the_seventeenth_stops_cpu_targets_table_is_its_output():
    _check_targets_table("reports/targets/cpu-2026-11-28-8a31736.md",
                         "## A trial's scores formed a few samples at a time",
                         "| | the sixteenth stop's run | this run | target 3× |")


def test_the_twentieth_stops_cpu_targets_table_is_its_output():
    _check_targets_table("reports/targets/cpu-2026-11-29-da598b3.md",
                         "## `growbench targets` on an AVX2 host",
                         "| | the seventeenth stop's run (AVX-512) | this run (AVX2) | target 3× |")
