"""The report and the default-strategy recommendation: figures, self-contained HTML, the rule, bad databases."""

from __future__ import annotations

import hashlib
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from matplotlib.colors import rgb_to_hsv, to_rgb

from growbench import strategies
from growbench.harness import recommend as R
from growbench.harness.cli import main as cli_main
from growbench.harness.report.build import build_report
from growbench.harness.report.figures.base import log_axis
from growbench.harness.report.figures.palette import dataset_colors
from growbench.harness.report.figures.pareto import pareto
from growbench.harness.report.output import MANIFEST
from growbench.harness.report.render import html_breakable, render_html, render_markdown
from growbench.harness.report.sections import Bullet, Bullets, Link, Paragraph, Report, Section, Span, Table
from growbench.harness.store.results import ResultsDB

FIGURES = ("pareto", "generalisation", "tokens", "ablation", "breakdown", "scaling", "formula_gap", "lambda", "devices")
DEFAULT = strategies.default_spec()  # the fixture follows whatever default.json says
HOSTILE = "<script>alert('x')</script>"


def spec_of(name: str) -> str:
    return strategies.canonical(name)


_n = 0


def row(strategy, dataset="teacher", *, seed=0, device="cpu", d_s=16, d_e=8, b=8, n_batches=4, t=0.01, opt=0.9,
        heldout=0.01, status="ok", error=None, lam=1.0, extra=None, heldout_before=1.0, heldout_se=1e-4) -> dict:
    """One results row as the harness writes it (values chosen by the test)."""
    global _n
    _n += 1
    r = dict(key=f"k{_n}", status=status, error=error, strategy=strategy, dataset=dataset, d_s=d_s, d_e=d_e, b=b,
             d_k=2, p=2, seed=seed, device=device, n_batches=n_batches, repeats=1, warmup_steps=5, dtype="float32",
             scale_policy="rescale", heldout_batches=16, torch_version="2.13.0+cpu", device_name=f"{device} device",
             threads=1,
             git_commit="abc", code_version="v1", hostname="h", python="3.11", started_at="2026-01-01T00:00:00",
             finished_at="2026-01-01T00:00:01")
    if status != "ok":
        return r
    r.update(optimality=opt, first_order_decrease=0.1, loss_before=1.0, loss_after=1.0 - 0.01 * opt,
             loss_decrease=0.01 * opt, heldout_before=heldout_before, heldout_after=heldout_before - heldout,
             heldout_decrease=heldout, heldout_decrease_se=heldout_se, heldout_tokens=16 * b * d_s,
             statistics_tokens=n_batches * b * d_s, bottleneck=0.5, lam=lam, n_loss_evals=5, fallback="",
             t_statistics=0.3 * t, t_direction=0.1 * t, t_truncation=0.1 * t, t_line_search=0.4 * t, t_total=t,
             t_floor=0.2 * t, t_loss_eval=0.05 * t, peak_mem_bytes=1000, peak_mem_method="sampled_rss_increase",
             extra=extra if extra is not None else {})
    return r


def lambda_curve(lam_star: float) -> dict:
    lams = [2.5 * lam_star * i / 24 for i in range(25)]
    fast = [1.0 - 0.02 * x + 0.01 * x * x / lam_star for x in lams]
    normal = [f + 0.001 * x for f, x in zip(fast, lams, strict=True)]
    return {"lam": lams, "fast": fast, "normal": normal, "loss0": 1.0, "slope": -0.02}


def fixture_rows() -> list[dict]:
    """Two datasets × presets, the default's one-axis variants, baselines; a scaling grid; CUDA twins; failures."""
    variants = list(dict.fromkeys([
        DEFAULT, "gram/solve/full+metric/fast:newton", "gram/solve/full+metric/normal:newton",
        "gram/solve/full+metric/fast:grid", "gram/solve/full+metric/fast:bounded", "gram/solve/full/fast:newton",
        "gram/pinv/full+metric/fast:newton", "gram/solve/rsvd+metric/fast:newton",
        "joint/solve/full+metric/fast:newton",
    ]))
    growth = [spec_of(p) for p in ("formula1", "formula2", "formula4", "joint")] + variants
    rows = []
    for di, ds in enumerate(("teacher", "text")):
        for seed in (0, 1):
            for i, s in enumerate(growth):
                c = strategies.parse(s)
                opt = 0.95 - 0.03 * i - 0.2 * (c["averaging"] == "per-sample") - 0.1 * (not c["metric"])
                t = 0.002 * (1 + i) * (1 + 0.1 * seed) * (1 + di)
                extra = {"lambda_curve": lambda_curve(2.0)}
                if s == spec_of("formula2"):
                    extra["formula_gap"] = {"rel_diff": 0.05, "score_cosine": 0.99}
                lam = {"grid": 2.1, "bounded": 1.95, "newton": 2.0, "quadratic": 2.05, "bracket": 1.98}[c["method"]]
                for device, f in (("cpu", 1.0), ("cuda", 0.2)):
                    if device == "cuda" and seed:
                        continue
                    rows.append(row(s, ds, seed=seed, device=device, t=t * f, opt=opt, heldout=0.01 * opt, lam=lam,
                                    extra=extra))
            for base in ("random", "zero"):
                rows.append(row(base, ds, seed=seed, t=0.001, opt=0.05, heldout=0.0001, lam=0.0))
    # Scaling grid on teacher: d_e in 8, 16, 32, 64 at n_batches=2 (formula 2 records its gap to formula 1).
    for d_e in (8, 16, 32, 64):
        for s, k in ((spec_of("formula2"), 1.0), (DEFAULT, 2.0)):
            gap = {"formula_gap": {"rel_diff": 0.1 * d_e / 8, "score_cosine": 1 - 0.02 * d_e / 8}} \
                if s == spec_of("formula2") else {}
            rows.append(row(s, "teacher", d_e=d_e, n_batches=2, t=1e-4 * d_e ** k, extra=gap))
    # Statistics-tokens study: the default at 1, 4 (the reference configuration) and 16 batches; its gain grows
    # with the tokens and is positive on every seed from 4 batches on.
    for ds in ("teacher", "text"):
        for seed in (0, 1):
            for n, gain in ((1, -0.001 + 0.002 * seed), (16, 0.02)):
                rows.append(row(DEFAULT, ds, seed=seed, n_batches=n, heldout=gain))
    rows.append(row(HOSTILE, "teacher", status="failed", error=f"RuntimeError: boom {HOSTILE}\ntraceback"))
    return rows


def write_db(path: Path, rows: list[dict]) -> Path:
    with ResultsDB(path) as db:
        for r in rows:
            db.write(r)
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("rep")
    db = write_db(root / "r.sqlite", fixture_rows())
    out = root / "out"
    done = build_report(db, out)
    return db, out, done


class _Doc(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.imgs, self.links, self.text = [], [], [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        if tag == "img":
            self.imgs.append(a.get("src", ""))
        for k in ("src", "href"):
            if a.get(k) and tag != "img":
                self.links.append(a[k])

    def handle_data(self, data):
        self.text.append(data)


# ------------------------------------------------------------------ report
def test_every_figure_is_written_png_and_svg(built):
    _, out, done = built
    assert set(done["figures"]) == set(FIGURES), done["notes"]
    for name in FIGURES:
        for ext in ("png", "svg"):
            f = out / "figures" / f"{name}.{ext}"
            assert f.is_file() and f.stat().st_size > 1000, f
    assert (out / "figures" / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for f in ("report.html", "report.md", "summary.csv", "recommendation.json"):
        assert (out / f).stat().st_size > 0


def test_html_is_self_contained_and_escapes_database_strings(built):
    _, out, _ = built
    text = (out / "report.html").read_text()
    doc = _Doc()
    doc.feed(text)
    doc.close()
    assert len(doc.imgs) == len(FIGURES)
    assert all(src.startswith("data:image/png;base64,") for src in doc.imgs)
    # No external resource: no scripts, stylesheets or links out of the page.
    assert "script" not in doc.tags and "link" not in doc.tags
    # The only links out of the page are to each figure's SVG beside it, for zooming (tests/test_figures.py).
    assert all(h.startswith("#") or re.fullmatch(r"figures/\w+\.svg", h) for h in doc.links), doc.links
    # The hostile strategy name and error message are shown, escaped.
    assert "<script>" not in text and "&lt;script&gt;alert(" in text
    assert any(HOSTILE in t for t in doc.text)
    assert "failed runs" in text.lower()
    md = (out / "report.md").read_text()
    assert "<script>" not in md and "figures/pareto.png" in md
    assert md.splitlines()[0].startswith("# ") and md.splitlines()[2].startswith("## Should you grow?")
    assert "growbench report --db" in md.split("## Advice", 1)[0]


def test_captions_are_computed_from_the_data(built):
    _, out, _ = built
    text = (out / "report.html").read_text()
    # Formula-gap rows grow with d_e at fixed d_s (ratio shrinks): the gap grows with d_s/d_e -> confirm.
    assert "The data confirm the starting notes" in text
    # Scaling fits: default's times were made ∝ d_e², formula 2's ∝ d_e.
    assert f"to 2.00 ({R.label(DEFAULT)})" in text
    assert re.search(r"is [0-9.]+× (faster|slower) than formula1 \(median over 2 datasets", text)


def test_recommendation_file_and_summary(built):
    _, out, _ = built
    data = json.loads((out / "recommendation.json").read_text())
    rec = data["regimes"]["cpu/small"]
    assert rec["spec"] and "rule" in data and rec["evidence"] and rec["table"]
    import pandas as pd

    s = pd.read_csv(out / "summary.csv")
    assert {"dataset", "device", "strategy", "preset", "total_ms", "optimality", "failed"} <= set(s.columns)


def test_report_opens_with_advice_derived_from_the_data(built):
    db, out, _ = built
    rec = R.recommend(R.load_frame(db))
    md = (out / "report.md").read_text()
    sections = re.findall(r"^## (.+)$", md, re.MULTILINE)
    assert sections[:4] == ["Should you grow? One answer per kind of data", "What to use", "Advice", "Database"]
    advice = md.split("## Advice", 1)[1].split("\n## ", 1)[0]
    assert f"- **cpu, d_e ≤ 128**: **use** `{rec.spec}`" in advice
    assert f"{rec.evidence['median_time_ms']:.3g} ms per growth" in advice
    html = (out / "report.html").read_text()
    assert '<h2 id="advice">Advice</h2>' in html and f"<code>{html_breakable(rec.spec)}</code>" in html


def test_each_figure_has_a_two_sentence_caption_and_its_numbers_in_a_table(built):
    _, out, _ = built
    md = (out / "report.md").read_text()
    for name in FIGURES:
        section = md.split(f"](figures/{name}.png)", 1)[1].split("\n## ", 1)[0]
        caption = section.strip().split("\n\n", 1)[0]
        # Sentences end in ". " followed by a capital letter; "e.g." and decimals do not.
        assert len(re.findall(r"\. [A-Z]", caption)) <= 1, (name, caption)
        assert "\n| " in section, f"{name}: no table of numbers beside the caption"


def test_one_report_model_renders_to_html_and_markdown():
    section = Section("Results", [
        Paragraph.of("Plain ", HOSTILE, " and ", Span("spec/x", "code"), Span("bold|*", "strong"), ", see ",
                     Link("failures", "failed", "Failed runs"), "."),
        Table(pd.DataFrame({"name": [HOSTILE], "value": [0.123456], "count": [3], "ok": [True]}), wide=("name",)),
        Bullets([Bullet((Span("teacher", "strong"),), ("(a) met", "(b) NOT met"))]),
    ], anchor="results")
    report = Report("growbench report", "growbench report --db x", "now", [section])
    html, md = render_html(report), render_markdown(report)
    assert "<script>" not in html and "&lt;script&gt;" in html and 'href="#failed"' in html
    assert '<td class="num">0.1235</td>' in html and "<td class=\"str\">yes</td>" in html
    assert "<script>" not in md and "(#failed-runs)" in md and r"`spec/x`**bold\|\***" in md
    assert "| name | value | count | ok |" in md and "| 0.1235 | 3 | yes |" in md
    assert "- **teacher**\n  - (a) met\n  - (b) NOT met" in md
    assert md.endswith("\n") and not md.endswith("\n\n")


def test_pareto_names_cover_no_marker(built):
    """Strategy names are moved off every marker and error bar, and off one another."""
    db, _, _ = built
    frame = R.load_frame(db)
    result = pareto(frame, R.recommend(frame).spec)
    fig = result.fig
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        names = [t.get_window_extent(renderer) for t in ax.texts if t.get_text()]
        markers = [tuple(p) for c in ax.collections for p in ax.transData.transform(c.get_offsets())]
        assert names
        for i, box in enumerate(names):
            assert not any(box.overlaps(other) for other in names[i + 1:]), ax.get_title()
            assert not any(box.x0 < x < box.x1 and box.y0 < y < box.y1 for x, y in markers), ax.get_title()


def test_log_tick_labels_never_collide():
    for low, high in ((1.8, 30), (0.9, 3000), (150, 2500)):
        fig, ax = plt.subplots(figsize=(4, 3))
        ax.plot([low, high], [0, 1])
        ax.set_xlim(low, high)
        log_axis(ax, "x")
        fig.canvas.draw()
        boxes = [t.get_window_extent() for t in ax.get_xticklabels() if t.get_text() and t.get_visible()
                 and low <= t.get_position()[0] <= high]
        assert len(boxes) >= 2 and all(not a.overlaps(b) for a, b in zip(boxes, boxes[1:], strict=False))
        plt.close(fig)


def test_palette_one_hue_per_family_and_shades_within():
    colors = dataset_colors(["teacher", "minilm-recovery:layer=1:head=3", "minilm-similarity:layer=4:head=7", "text"])
    assert len(set(colors.values())) == 4
    hue = {name: round(float(rgb_to_hsv(to_rgb(c))[0]), 2) for name, c in colors.items()}
    assert hue["minilm-recovery:layer=1:head=3"] == hue["minilm-similarity:layer=4:head=7"]
    assert len({hue["teacher"], hue["text"], hue["minilm-recovery:layer=1:head=3"]}) == 3


# ------------------------------------------------------------------ bad databases
@pytest.mark.parametrize("command", ["report", "recommend"])
def test_missing_empty_and_all_failed_databases_exit_2(tmp_path, capsys, command):
    missing = tmp_path / "nope.sqlite"
    assert cli_main([command, "--db", str(missing), *(["--out", str(tmp_path / "o")] if command == "report"
                                                      else [])]) == 2
    assert "no successful runs in" in capsys.readouterr().err and not missing.exists()

    empty = tmp_path / "empty.sqlite"
    ResultsDB(empty).close()
    assert cli_main([command, "--db", str(empty)]) == 2
    assert "no successful runs in" in capsys.readouterr().err

    failed = write_db(tmp_path / "failed.sqlite", [row("formula1", status="failed", error="ValueError: bad"),
                                                   row("default", status="failed", error="x")])
    assert cli_main([command, "--db", str(failed)]) == 2
    err = capsys.readouterr().err
    assert "no successful runs in" in err and "all 2 runs failed" in err and "ValueError: bad" in err

    junk = tmp_path / "junk.sqlite"
    junk.write_text("not a database")
    assert cli_main([command, "--db", str(junk)]) == 2
    err = capsys.readouterr().err  # not a database at all: refused as such, naming the file (tests/test_db_schema.py)
    assert str(junk) in err and "not an SQLite database" in err


# ------------------------------------------------------------------ the rule
FAST_BAD = "gram/solve/rsvd+metric/fast:newton"  # fastest, 3 % worse optimality on one dataset
SECOND = DEFAULT  # second fastest, within 2 % everywhere
FLAKY = "gram/solve/full+metric/fast:bounded"  # even faster and best, but failed once
BEST = "joint/solve/full+metric/fast:newton"  # best everywhere, slow
PARTIAL = "gram/pinv/full+metric/fast:newton"  # fast and good, but ran on one dataset only


def rule_rows() -> list[dict]:
    """Held-out gains (share of a held-out loss of 1) over three seeds, seed noise ±0.0001 around each mean."""
    rows = []
    for ds in ("A", "B"):
        for seed in (0, 1, 2):
            noise = 1e-4 * (seed - 1)
            rows += [
                row(BEST, ds, seed=seed, t=0.010, opt=0.90, heldout=0.0100 + noise),
                row(SECOND, ds, seed=seed, t=0.002, opt=0.50, heldout=0.0090 + noise),  # 90 % of the best's gain
                row(FAST_BAD, ds, seed=seed, t=0.001, opt=0.99, heldout=(0.0070 if ds == "B" else 0.0100) + noise),
                row(FLAKY, ds, seed=seed, t=0.0005, opt=0.95, heldout=0.0200),
                row("random", ds, seed=seed, t=0.0001, opt=0.99, heldout=0.5),  # a baseline is never eligible
            ]
            if ds == "A":
                rows.append(row(PARTIAL, ds, seed=seed, t=0.0004, opt=0.95, heldout=0.0200))
    rows.append(row(FLAKY, "A", seed=9, status="failed", error="RuntimeError: singular"))
    # Another configuration with fewer strategies must not change the reference configuration.
    rows.append(row(SECOND, "A", d_e=64, t=5.0, opt=0.0, heldout=-1.0))
    return rows


def test_recommendation_follows_the_rule(tmp_path, capsys):
    db = write_db(tmp_path / "r.sqlite", rule_rows())
    rec = R.recommend(R.load_frame(db))
    # FLAKY (failed once), PARTIAL (one dataset) and the baseline are out; FAST_BAD keeps 70 % of the best gain on B.
    assert rec.spec == SECOND and not rec.fallback and rec.verdict == R.GENERALISES
    t = rec.table.set_index("strategy")
    reason = t.loc[FAST_BAD, "reason"]
    assert "B: not shown within 20% of the best's gain (0.7% vs 1%, paired difference -0.3%" in reason
    assert not t.loc[FAST_BAD, "qualifies"] and t.loc[FAST_BAD, "eligible"] and t.loc[FAST_BAD, "lowers"]
    assert "failed 1 of 7 runs (first: RuntimeError: singular)" in t.loc[FLAKY, "reason"]
    assert not t.loc[FLAKY, "eligible"] and not t.loc[PARTIAL, "eligible"]
    assert "no run on B" in t.loc[PARTIAL, "reason"]
    assert "qualifies but slower" in t.loc[BEST, "reason"] and t.loc[BEST, "qualifies"]
    assert "random" not in set(rec.table.strategy) and "random" in rec.excluded_baselines
    # Optimality does not decide: SECOND's 0.5 against BEST's 0.9 is only a diagnostic.
    ev = rec.evidence["B"]
    assert ev["best_heldout_gain"] == pytest.approx(0.0100) and ev["best_strategy"] in (BEST, FAST_BAD)
    assert ev["heldout_gain"][0] == pytest.approx(0.0090) and ev["within"] and ev["lowers"]
    assert ev["optimality"] == pytest.approx(0.5) and ev["time_ms"] == pytest.approx(2.0)
    # The reference configuration is the one with every strategy, not the d_e=64 run.
    assert "d_e=8" in rec.cells["A"]

    assert cli_main(["recommend", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert f"choice: {SECOND}" in out and "rule:" in out and "runners-up" in out
    assert FAST_BAD in out and FLAKY in out


def test_tied_configurations_each_count_as_a_dataset(tmp_path):
    # One dataset at two widths with the same strategies and seeds (the scale set's widths of one band): FAST_BAD
    # keeps 90 % of the best's gain at the smaller width and 50 % at the larger. With the smaller width alone
    # deciding, FAST_BAD would be chosen (it is the fastest and within there).
    rows = []
    for seed in range(4):
        noise = 1e-4 * (seed - 1.5)
        for d_e, fast_gain in ((8, 0.0090), (16, 0.0050)):
            rows += [row(BEST, "A", seed=seed, d_e=d_e, t=0.010, heldout=0.0100 + noise),
                     row(FAST_BAD, "A", seed=seed, d_e=d_e, t=0.001, heldout=fast_gain + noise)]
    rec = R.recommend(R.load_frame(write_db(tmp_path / "tie.sqlite", rows)))
    assert rec.spec == BEST and rec.verdict == R.GENERALISES
    assert sorted(rec.datasets) == ["A @ d_e=16", "A @ d_e=8"]
    assert "d_e=16" in rec.cells["A @ d_e=16"] and "d_e=8 " in rec.cells["A @ d_e=8"]
    reason = rec.table.set_index("strategy").loc[FAST_BAD, "reason"]
    assert "A @ d_e=16: not shown within 20% of the best's gain (0.5% vs 1%" in reason
    assert "A @ d_e=8:" not in reason
    # A configuration with fewer runs does not tie: one seed fewer at d_e=16 leaves d_e=8 alone, and FAST_BAD wins.
    fewer = [r for r in rows if not (r["d_e"] == 16 and r["seed"] == 3)]
    rec = R.recommend(R.load_frame(write_db(tmp_path / "fewer.sqlite", fewer)))
    assert rec.spec == FAST_BAD and list(rec.datasets) == ["A"] and "d_e=8 " in rec.cells["A"]


def test_fallback_when_nothing_qualifies(tmp_path, capsys):
    # Each lowers the held-out loss everywhere, but each keeps only 50 % of the other's gain on one dataset.
    x, y = DEFAULT, BEST
    rows = []
    for seed in (0, 1, 2):
        e = 1e-5 * seed
        rows += [row(x, "A", seed=seed, t=0.001, heldout=0.02 + e), row(x, "B", seed=seed, t=0.001, heldout=0.01 + e),
                 row(y, "A", seed=seed, t=0.002, heldout=0.01 + e), row(y, "B", seed=seed, t=0.002, heldout=0.02 + e)]
    db = write_db(tmp_path / "r.sqlite", rows)
    rec = R.recommend(R.load_frame(db))
    assert rec.fallback and rec.verdict == R.CLOSEST and rec.spec == x  # equal worst shortfall (50 %): the faster
    target = tmp_path / "default.json"
    assert cli_main(["recommend", "--db", str(db), "--write", "--default-file", str(target)]) == 1
    assert not target.exists() and "FALLBACK" in capsys.readouterr().out
    assert cli_main(["recommend", "--db", str(db), "--write", "--force", "--default-file", str(target)]) == 0
    entry = json.loads(target.read_text())["regimes"]["cpu/small"]
    assert entry["fallback"] is True and entry["verdict"] == "closest" and entry["generalises"] is True


def test_write_default_is_read_by_make(tmp_path, monkeypatch, capsys):
    db = write_db(tmp_path / "r.sqlite", rule_rows())
    target = tmp_path / "default.json"
    assert cli_main(["recommend", "--db", str(db), "--write", "--default-file", str(target)]) == 0
    data = json.loads(target.read_text())
    entry = data["regimes"]["cpu/small"]
    assert list(entry)[0] == "spec" and entry["spec"] == SECOND and list(data["regimes"]) == ["cpu/small"]
    assert {"rule", "db", "generated"} <= set(data) and entry["evidence"]["A"]["within"]
    import growbench.strategies.spec as reg

    monkeypatch.setattr(reg, "DEFAULT_FILE", str(target))  # an absolute path: joinpath yields it
    assert strategies.default_spec() == SECOND and strategies.make("default").resolve("cpu", 8).spec == SECOND


# ------------------------------------------------------------------ the preset a database holds
@pytest.mark.parametrize("preset", ["smoke", "objective-tokens", "quick"])
def test_the_preset_is_named_only_for_exactly_its_configurations(preset):
    """``infer_sweep`` names the preset whose configurations are the database's, and none for one configuration fewer
    or one more (a run of another preset), whatever the order of the rows."""
    from growbench.harness.report.sweep import infer_sweep
    from growbench.harness.runner.sweep import expand, sweep_presets

    presets = sweep_presets()
    configs = expand(presets[preset])
    frame = pd.DataFrame([c.as_dict() for c in configs])
    other = next(c for name, grids in presets.items() if name != preset for c in expand(grids) if c not in configs)
    assert infer_sweep(frame) == preset
    assert infer_sweep(frame.iloc[::-1]) == preset
    assert infer_sweep(frame.iloc[1:]) is None
    assert infer_sweep(pd.concat([frame, pd.DataFrame([other.as_dict()])])) is None


# ------------------------------------------------------------------ a real (tiny) sweep
def test_report_of_a_tiny_real_sweep(tmp_path):
    from growbench.harness.runner.sweep import expand, run_sweep

    grid = dict(strategies=["formula1", "formula2", "default", "gram/solve/full+metric/normal:newton", "zero"],
                datasets=["teacher", "text"], d_s=[8], d_e=[8], b=[8], d_k=[2], p=[2], seeds=[0], devices=["cpu"],
                n_batches=2, repeats=1, warmup_steps=5)
    db = tmp_path / "r.sqlite"
    frame = run_sweep(expand([grid]), str(db), cache_dir=str(tmp_path / "c"), progress=False)
    assert (frame.status == "ok").all()
    # Figures of an earlier report that this one does not draw (or draws without SVG) are removed: those its
    # manifest lists, unchanged (tests/test_bad_input_files.py: nothing else in the folder is touched).
    (tmp_path / "out" / "figures").mkdir(parents=True)
    for stale in ("scaling.png", "pareto.svg"):
        (tmp_path / "out" / "figures" / stale).write_text("old")
    old = [hashlib.sha256(b"old").hexdigest()]
    (tmp_path / "out" / MANIFEST).write_text(json.dumps({"files": {"figures/scaling.png": old,
                                                                   "figures/pareto.svg": old}}))
    done = build_report(db, tmp_path / "out", svg=False)
    assert {"pareto", "ablation", "breakdown", "formula_gap", "lambda"} <= set(done["figures"])
    left = {f.name for f in (tmp_path / "out" / "figures").iterdir()}
    assert "pareto.png" in left and not {"scaling.png", "pareto.svg"} & left
    notes = " ".join(done["notes"])
    assert "scaling" in notes and "no GPU comparison" in notes.replace("No GPU", "no GPU")
    assert R.recommend(R.load_frame(db)).spec is not None


def test_a_change_that_matters_on_one_dataset_is_never_said_not_to_matter():
    from growbench.harness.report.advice import _ablation_statements

    a, b = "gram/solve/full+metric/normal:bracket", "gram/pinv/full+metric/normal:bracket"
    rows = []
    for seed in range(3):
        for ds, shift in (("A", 0.0), ("B", 0.01)):  # B: pinv gains 1 % of the held-out loss more, A: nothing
            rows += [row(a, ds, seed=seed, t=0.01, heldout=0.01), row(b, ds, seed=seed, t=0.01, heldout=0.01 + shift)]
    said = " ".join(_ablation_statements(pd.DataFrame(rows)))
    assert "inverse" not in said
    same = [r | {"heldout_decrease": 0.01, "heldout_after": 0.99} for r in rows]
    assert "the inverse (pinv → solve)" in " ".join(_ablation_statements(pd.DataFrame(same)))


# ------------------------------------------------------------------ runs without a usable time
@pytest.mark.parametrize("value, share", [("NULL", "every"), ("NULL", "half"), ("9e999", "half"), ("-9e999", "every"),
                                          ("0", "half")])
def test_runs_without_a_usable_time_are_left_out_of_time_with_a_note(tmp_path, capsys, value, share):
    """``report`` on a database whose timings are NULL or infinite ended in a TypeError traceback: now both commands
    succeed, the report says how many runs have no usable time and what it did with them, and no figure, table or
    sentence of it shows an infinity or a NaN."""
    import sqlite3

    db = write_db(tmp_path / "r.sqlite", fixture_rows())
    with sqlite3.connect(db) as con:
        timings = [c for (_, c, *_) in con.execute("PRAGMA table_info(runs)") if c.startswith("t_")]
        where = " WHERE rowid % 2 = 0" if share == "half" else ""
        con.execute(f"UPDATE runs SET {', '.join(f'{c} = {value}' for c in timings)}{where}")
        ok = con.execute("SELECT COUNT(*) FROM runs WHERE status = 'ok'").fetchone()[0]
        hit = con.execute(f"SELECT COUNT(*) FROM runs WHERE status = 'ok'{where.replace('WHERE', 'AND')}").fetchone()[0]
    out = tmp_path / "out"
    assert cli_main(["report", "--db", str(db), "--out", str(out)]) == 0
    assert cli_main(["recommend", "--db", str(db)]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "failed" not in err, err
    md = (out / "report.md").read_text()
    assert f"{hit} of {ok} successful runs have no usable time" in md
    assert not re.search(r"(?<![\w.])-?(nan|inf)(?![\w])", md, re.I), re.search(r".{60}\b(nan|inf)\b.{20}", md, re.I)
    frame = R.load_frame(db)
    assert int(R.untimed(frame).sum()) == hit and frame.t_total.dropna().gt(0).all()
    if share == "half":  # the timed half still draws the figures of time
        assert (out / "figures" / "pareto.png").exists() and (out / "figures" / "breakdown.png").exists()


# ------------------------------------------------------------------ plain answers per kind of data
def _evidence(gains: dict[str, tuple[float, float, float]], n: int = 5) -> dict:
    return {ds: {"heldout_gain": [mean, low, high, n]} for ds, (mean, low, high) in gains.items()}


def test_answers_group_synthetic_natural_and_each_pretrained_model_and_task():
    """One answer per kind of data, a pretrained model answered per task: every registered pretrained dataset (the
    MiniLM tasks, and any model added later) lands under its own model and task, from the class alone."""
    from types import SimpleNamespace

    from growbench.datasets.registry import DATASETS
    from growbench.harness.report.answers import GROW, GROW_WHERE_SHOWN, NO_EVIDENCE, dataset_kind, plain_answers

    pretrained = [name for name, cls in DATASETS.items() if cls.kind == "pretrained"]
    assert {"minilm-recovery", "minilm-similarity"} <= set(pretrained)
    for name in pretrained:
        kind, label = dataset_kind(f"{name}:layer=1:head=2")
        cls = DATASETS[name]
        assert kind == f"pretrained:{cls.model_name}:{cls.task}" and label == f"Pretrained {cls.model_name}, {cls.task}"
    assert dataset_kind("teacher @ d_e=768") == ("synthetic", "Synthetic tasks")
    assert dataset_kind("my-plugin-data") == ("other", "Other data")
    assert dataset_kind('=HYPERLINK("http://evil.example","click")') == ("other", "Other data")

    small = _evidence({"teacher": (0.5, 0.4, 0.6), "icl-regression": (0.006, -0.003, 0.016),
                       "digits": (0.007, 0.002, 0.012), "text": (0.0003, -0.0001, 0.0008)})
    medium = _evidence({f"{name}:layer=4:head=7": (0.3, 0.1, 0.5) if "recovery" in name else (0.001, -0.01, 0.01)
                        for name in pretrained})
    recs = {"cpu/small": SimpleNamespace(regime="cpu/small", spec="gram/solve/full/normal:grid", evidence=small),
            "cpu/medium": SimpleNamespace(regime="cpu/medium", spec="gram/pinv/full/normal:grid", evidence=medium)}
    answers = plain_answers(recs)
    labels = [a.label for a in answers]
    assert labels[:2] == ["Synthetic tasks", "Small models on natural data"]
    assert len(labels) == 2 + len({(DATASETS[n].model_name, DATASETS[n].task) for n in pretrained})
    verdicts = {a.label: a.verdict for a in answers}
    assert verdicts["Synthetic tasks"] == verdicts["Small models on natural data"] == GROW_WHERE_SHOWN
    assert verdicts["Pretrained MiniLM, head recovery"] == GROW
    assert verdicts["Pretrained MiniLM, contrastive objective"] == NO_EVIDENCE
    synthetic = answers[0].text()
    assert "teacher by 50% [40, 60] over 5 seeds" in synthetic
    assert "no evidence it helps on icl-regression (+0.6% [-0.3, +1.6] over 5 seeds)" in synthetic


def test_answers_say_do_not_grow_where_the_default_raises_the_held_out_loss():
    from types import SimpleNamespace

    from growbench.harness.report.answers import DO_NOT_GROW, plain_answers

    rec = SimpleNamespace(regime="cpu/small", spec="gram/solve/full/normal:grid",
                          evidence=_evidence({"digits": (-0.01, -0.02, -0.004), "text": (0.01, 0.002, 0.02)}))
    (answer,) = plain_answers({"cpu/small": rec})
    assert answer.verdict == DO_NOT_GROW
    assert "it raises the held-out loss beyond seed noise on digits (gain -1% [-2, -0.4] over 5 seeds)" in answer.text()


def test_a_regime_of_two_pretrained_architectures_says_what_the_rule_chooses_on_each_alone():
    import pandas as pd

    from growbench.harness.report.answers import architecture_bullets, by_architecture
    from growbench.harness.rule.choice import recommend_regimes

    rows = []
    # Two models' datasets in one regime: on the encoder's, A is best; on the decoder's, B; each lowers every loss.
    gains = {("minilm-recovery", "A"): 0.30, ("minilm-recovery", "B"): 0.10, ("smollm-recovery", "A"): 0.05,
             ("smollm-recovery", "B"): 0.20}
    for (ds, which), gain in gains.items():
        spec = {"A": "gram/ridge/rsvd+metric/normal:bracket", "B": "gram/solve/rsvd+metric/normal:bracket"}[which]
        d_e = 384 if ds.startswith("minilm") else 576
        for seed in range(3):
            rows.append(dict(status="ok", strategy=spec, dataset=ds, d_s=32, d_e=d_e, b=8, d_k=4, p=4, seed=seed,
                             device="cpu", n_batches=2, repeats=1, warmup_steps=0, dtype="float32",
                             scale_policy="rescale", heldout_batches=4, heldout_before=1.0,
                             heldout_decrease=gain + 0.001 * seed, heldout_decrease_se=0.001, loss_before=1.0,
                             loss_decrease=gain, t_total=0.1, t_floor=0.05, path_efficiency=1.0, optimality=0.5,
                             statistics_tokens=512, error=None))
    frame = pd.DataFrame(rows)
    recs = recommend_regimes(frame)
    choices = by_architecture(frame, recs)["cpu/medium"]
    assert {c.model: c.spec for c in choices} == {"MiniLM": "gram/ridge/rsvd+metric/normal:bracket",
                                                   "SmolLM2": "gram/solve/rsvd+metric/normal:bracket"}
    (bullet,) = architecture_bullets({"cpu/medium": choices}, recs)
    assert "disagree" in str(bullet)
    owner = next(c.model for c in choices if c.spec == recs["cpu/medium"].spec)
    other = next(c.model for c in choices if c.spec != recs["cpu/medium"].spec)
    assert f"is {owner}'s choice, not {other}'s" in str(bullet)
