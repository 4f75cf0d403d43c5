"""``growbench report``: the ablation report of a results database.

Writes, under ``out``:

- ``report.html``: one self-contained page (figures embedded as base64 PNG, inline CSS,
  no external resource; every string from the database is HTML-escaped);
- ``report.md``: the same text, linking ``figures/*.png``;
- ``figures/<name>.png`` (and ``.svg`` unless ``svg=False``);
- ``summary.csv``: one line per dataset × device × strategy (``harness.runner.sweep.summary``);
- ``recommendation.json``: the default-strategy recommendation (``harness.recommend``);
- ``training_summary.csv``: when the database holds ``growbench train`` runs, one line per
  dataset × training variant (``harness.train_report.training_table``), and the section
  "Growth during training" in both reports.

A database with training runs but no successful growth-sweep run gets a report of the
training section alone.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import numbers
import shlex
import sys
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from harness.report import figures as F
from harness.recommend import (
    NoResults,
    Recommendation,
    is_growth,
    label,
    load_frame,
    preset_names,
    rank_note,
    recommend,
)

if TYPE_CHECKING:
    from harness.report.training import TrainingSection

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;max-width:1280px;margin:2em auto;padding:0 1em;
color:#222;line-height:1.45}
h1{margin-bottom:.2em} h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
figure{margin:1.2em 0} figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.95em;color:#333;background:#f7f7f9;padding:.6em .8em;border-left:3px solid #1f77b4}
table{border-collapse:collapse;font-size:.85em;margin:.6em 0} th,td{border:1px solid #ddd;padding:3px 6px}
th{background:#f0f0f0;text-align:left;vertical-align:bottom} td.num{text-align:right;font-variant-numeric:tabular-nums}
td.str{text-align:left;white-space:nowrap} .small table{font-size:.75em} th.row{vertical-align:top}
.wrap{overflow-x:auto} code,pre{background:#f4f4f4;padding:1px 4px;border-radius:3px}
pre{padding:.7em;white-space:pre-wrap} .note{color:#8a4b00;background:#fff6e5;padding:.5em .8em}
.choice{font-size:1.15em} td.text{text-align:left;white-space:normal;max-width:60em}
"""


NAMING = ("Strategy names: specs are averaging/inverse/truncation[+metric]/line_search:method; presets go by their "
          "names from strategies.presets(); in figures, default[x] is the default with one component changed to x "
          "(e.g. default[rsvd], default[−metric], default[normal search]).")


def _esc(s) -> str:
    return html.escape("" if s is None else str(s), quote=True)


def _md_esc(s) -> str:
    """Text from the database made inert in Markdown (no HTML, no table breaks)."""
    return (html.escape("" if s is None else str(s), quote=False).replace("|", r"\|").replace("`", r"\`")
            .replace("*", r"\*").replace("[", r"\[").replace("\n", " "))


def _md_table(df: pd.DataFrame, floatfmt: str = ".4g") -> str:
    if df.empty:
        return "_(none)_\n"

    def cell(v):
        if isinstance(v, float):
            return "" if math.isnan(v) else format(v, floatfmt)
        return _md_esc(v)

    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(_md_esc(c) for c in cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def _html_table(df: pd.DataFrame, floatfmt: str = "{:.4g}", wide_text: tuple[str, ...] = ()) -> str:
    """An HTML table of ``df``: every cell escaped, numbers right-aligned, text left-aligned."""
    if df.empty:
        return "<p><em>(none)</em></p>"

    def cell(col, v):
        if isinstance(v, bool):
            return f"<td>{'yes' if v else 'no'}</td>"
        if isinstance(v, numbers.Number):
            if isinstance(v, numbers.Real) and math.isnan(v):
                return '<td class="num"></td>'
            text = str(v) if isinstance(v, numbers.Integral) else floatfmt.format(v)
            return f'<td class="num">{_esc(text)}</td>'
        cls = "text" if col in wide_text else "str"
        return f'<td class="{cls}">{_esc(v)}</td>'

    head = "".join(f"<th>{_esc(c)}</th>" for c in df.columns)
    body = "\n".join("<tr>" + "".join(cell(c, v) for c, v in zip(df.columns, row, strict=True)) + "</tr>"
                     for row in df.itertuples(index=False))
    return f'<div class="wrap"><table><thead><tr>{head}</tr></thead><tbody>\n{body}\n</tbody></table></div>'


def failed_runs(frame: pd.DataFrame) -> pd.DataFrame:
    """The failed runs: configuration and the first line of the error."""
    f = frame[frame.status != "ok"]
    cols = ["strategy", "dataset", "d_s", "d_e", "b", "d_k", "p", "seed", "device", "status"]
    out = f[cols].copy()
    out["error"] = f.error.map(lambda e: str(e).strip().splitlines()[0] if isinstance(e, str) and e.strip() else "")
    return out.reset_index(drop=True)


def summary_table(frame: pd.DataFrame) -> pd.DataFrame:
    """``harness.runner.sweep.summary`` with the preset name of each spec."""
    from harness.runner.sweep import summary

    table = summary(frame)
    names = preset_names()
    table.insert(3, "preset", table.strategy.map(lambda s: names.get(s, "")))
    return table


def timing_reliability(frame: pd.DataFrame) -> str:
    """How much the floor (the same work for every strategy of one dataset, seed and configuration) varied
    between runs: a direct measure of how quiet the machine was."""
    from harness.recommend import CELL_COLUMNS

    ok = frame[(frame.status == "ok") & (frame.t_floor > 0)]
    spread = ok.groupby(["dataset", "seed", *CELL_COLUMNS], dropna=False).t_floor.agg(["min", "max", "size"])
    spread = spread[spread["size"] >= 3]
    if spread.empty:
        return "Too few runs per dataset/seed/configuration to judge timing noise."
    ratio = spread["max"] / spread["min"]
    lo = ok.merge(spread["min"].rename("group_min").reset_index(), on=["dataset", "seed", *CELL_COLUMNS])
    share = float((lo.t_floor > 3 * lo.group_min).mean())
    text = (f"The floor (the same work for every strategy of a dataset, seed and configuration) varied between runs by "
            f"a factor of {ratio.median():.2g} (median over {len(ratio)} groups; at most {ratio.max():.3g}); "
            f"{100 * share:.0f}% of runs measured a floor more than 3× their group's smallest.")
    if ratio.max() > 2:
        text += (" The machine was not quiet while the sweep ran (other load, CPU steal): differences in t_total "
                 "between runs of less than that factor are not meaningful. The ablation and time-breakdown figures "
                 "therefore compare times relative to each run's own floor, which is timed between the same run's "
                 "repeats; the Pareto front and the recommendation use t_total as specified.")
    else:
        text += " Timings are consistent between runs."
    return text


def database_facts(frame: pd.DataFrame, db: str) -> dict:
    ok = frame[frame.status == "ok"]

    def uniq(col):
        return ", ".join(sorted({str(v) for v in frame[col].dropna().unique()})) or "–"

    return {
        "database": str(db),
        "runs": len(frame), "ok": len(ok), "failed": int((frame.status != "ok").sum()),
        "strategies": frame.strategy.nunique(), "growth strategies": int(frame.strategy.drop_duplicates()
                                                                         .map(is_growth).sum()),
        "datasets": uniq("dataset"), "devices": uniq("device"), "device names": uniq("device_name"),
        "torch": uniq("torch_version"), "threads": uniq("threads"), "git commit": uniq("git_commit"),
        "code version": uniq("code_version"),
        "runs finished": f"{frame.finished_at.dropna().min()} – {frame.finished_at.dropna().max()}",
    }


def infer_sweep(frame: pd.DataFrame) -> str | None:
    """The sweep preset whose configurations are exactly the database's, if any (for the regenerating command)."""
    from dataclasses import fields

    from harness.measure import RunConfig
    from harness.runner.sweep import expand, sweep_presets

    cols = [f.name for f in fields(RunConfig)]
    try:
        have = {tuple(r) for r in frame[cols].astype(str).itertuples(index=False)}
        for name, grids in sweep_presets().items():
            want = {tuple(str(v) for v in c.as_dict().values()) for c in expand(grids)}
            if have == want:
                return name
    except Exception:  # noqa: BLE001 - only a convenience for the report's first lines
        return None
    return None


def _png_bytes(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _write_figures(results: list, figdir: Path, svg: bool) -> list[Path]:
    """Write each drawn figure as PNG (kept in ``r.png`` for the HTML) and SVG; close it."""
    import matplotlib.pyplot as plt

    written = []
    for r in results:
        if r.fig is None:
            continue
        png = _png_bytes(r.fig)
        (figdir / f"{r.name}.png").write_bytes(png)
        written.append(figdir / f"{r.name}.png")
        r.png = png
        if svg:
            r.fig.savefig(figdir / f"{r.name}.svg", format="svg")
            written.append(figdir / f"{r.name}.svg")
        plt.close(r.fig)
    return written


def _remove_stale(out: Path, figdir: Path, written: list[Path]) -> None:
    """Remove what an earlier report in ``out`` wrote and this one does not: it would be stale."""
    drawn = {p.name for p in written}
    for old in list(figdir.glob("*.png")) + list(figdir.glob("*.svg")):
        if old.name not in drawn:
            old.unlink()
    for name in ("summary.csv", "recommendation.json", "training_summary.csv"):
        if (out / name) not in written and (out / name).is_file():
            (out / name).unlink()


def _training(db, out: Path) -> tuple[TrainingSection | None, list[Path], str | None]:
    """The training section of ``db`` (None without a successful training run), its CSV, and the
    ``growbench train`` command that regenerates the runs when they are exactly a preset's."""
    from harness.report import training as T

    runs, curves = T.load_training(db)
    if not T.has_training(runs):
        return None, [], None
    section = T.build_training(runs, curves)
    section.table.to_csv(out / "training_summary.csv", index=False)
    preset = T.infer_train_preset(runs)
    command = (f"growbench train --preset {preset} --db {shlex.quote(str(db))}   # the training runs: exactly "
               f"the '{preset}' training preset's") if preset else None
    return section, [out / "training_summary.csv"], command


def build_report(db: str | Path, out: str | Path = "reports", *, svg: bool = True, command: str | None = None,
                 device: str | None = None) -> dict:
    """Write the report of ``db`` under ``out``; return ``{"files": [...], "figures": [...], "notes": [...]}``.

    When ``db`` holds ``growbench train`` runs, the report gains the section "Growth during
    training" and ``training_summary.csv``; when it holds training runs but no successful
    growth-sweep run, the report has that section only.

    Raises :class:`harness.recommend.NoResults` (a ``ValueError``) when the database is missing,
    empty or holds no successful run (of the growth sweep, nor of training).
    """
    out = Path(out)
    try:
        frame = load_frame(db)
        sweep_error = None
    except NoResults as e:
        from harness.report import training as T

        if not T.has_training(T.load_training(db)[0]):
            raise
        frame, sweep_error = None, str(e)
    figdir = out / "figures"
    figdir.mkdir(parents=True, exist_ok=True)
    command = command or f"growbench report --db {shlex.quote(str(db))} --out {shlex.quote(str(out))}"
    if frame is None:
        training, written, train_command = _training(db, out)
        return _training_only_report(db, out, figdir, svg, command, train_command, training, written, sweep_error)
    train_note = None
    try:
        training, written, train_command = _training(db, out)
    except Exception as e:  # noqa: BLE001 - the training section's failure must not lose the sweep's report
        print(f"growbench report: training section failed: {type(e).__name__}: {e}", file=sys.stderr)
        traceback.print_exc(file=sys.stderr)
        training, written, train_command = None, [], None
        train_note = f"training: the section could not be built: {type(e).__name__}: {e}"
    preset = infer_sweep(frame)
    if train_command:
        command = f"{train_command}\n{command}"
    if preset:
        command = (f"growbench run --preset {preset} --db {shlex.quote(str(db))}   # the database: "
                   f"its runs are exactly the '{preset}' sweep's\n{command}")

    rec: Recommendation | None
    try:
        rec = recommend(frame, device=device)
    except ValueError as e:
        rec = None
        rec_error = str(e)

    results = []
    makers = [lambda f: F.pareto(f, rec.spec if rec else None, bool(rec and rec.fallback)), F.ablation,
              F.breakdown, F.scaling, F.formula_convergence, F.loss_along_lambda, F.devices]
    for make in makers:
        try:
            r = make(frame)
        except Exception as e:  # noqa: BLE001 - one figure's failure must not lose the report
            name = getattr(make, "__name__", "figure")
            print(f"growbench report: figure {name} failed: {type(e).__name__}: {e}", file=sys.stderr)
            traceback.print_exc(file=sys.stderr)
            r = F.FigureResult(name, f"figure {name}", note=f"This figure could not be drawn: "
                                                            f"{type(e).__name__}: {e}")
        written += _write_figures([r], figdir, svg)  # one at a time: each figure is closed once written
        results.append(r)
    train_figs = training.figures if training else []
    written += _write_figures(train_figs, figdir, svg)

    summary = summary_table(frame)
    summary.to_csv(out / "summary.csv", index=False)
    written.append(out / "summary.csv")
    rec_json = rec.as_json(str(db)) if rec else {"spec": None, "error": rec_error}
    if rec:
        rec_json["table"] = json.loads(rec.table.to_json(orient="records"))
        rec_json["reference_configurations"] = rec.cells
    (out / "recommendation.json").write_text(json.dumps(rec_json, indent=2) + "\n")
    written.append(out / "recommendation.json")
    _remove_stale(out, figdir, written)

    facts = database_facts(frame, str(db))
    facts["timing noise"] = timing_reliability(frame)
    if training:
        facts["training runs"] = (f"{training.facts['training runs']} ({training.facts['ok']} ok, "
                                  f"{training.facts['failed']} failed): see Growth during training")
    fails = failed_runs(frame)
    generated = datetime.now(UTC).isoformat(timespec="seconds")
    (out / "report.html").write_text(_html(results, rec, rec_json, facts, summary, fails, command, generated,
                                           training))
    (out / "report.md").write_text(_markdown(results, rec, rec_json, facts, summary, fails, command, generated,
                                             training))
    written += [out / "report.html", out / "report.md"]
    shown = results + train_figs
    return {"files": [str(p) for p in written], "figures": [r.name for r in shown if r.fig is not None],
            "notes": [f"{r.name}: {r.note}" for r in shown if r.fig is None] + ([train_note] if train_note else [])}


def _training_only_report(db, out: Path, figdir: Path, svg: bool, command: str, train_command: str | None,
                          training: TrainingSection, written: list[Path], sweep_error: str) -> dict:
    """The report of a database with training runs and no successful growth-sweep run."""
    if train_command:
        command = f"{train_command}\n{command}"
    written += _write_figures(training.figures, figdir, svg)
    _remove_stale(out, figdir, written)
    generated = datetime.now(UTC).isoformat(timespec="seconds")
    note = f"No growth-sweep section: {sweep_error}."
    (out / "report.html").write_text(_html_training_only(training, str(db), command, generated, note))
    (out / "report.md").write_text(_markdown_training_only(training, str(db), command, generated, note))
    written += [out / "report.html", out / "report.md"]
    return {"files": [str(p) for p in written], "figures": [r.name for r in training.figures if r.fig is not None],
            "notes": [f"{r.name}: {r.note}" for r in training.figures if r.fig is None]}


# ------------------------------------------------------------------ rendering
def _rec_tables(rec: Recommendation) -> tuple[pd.DataFrame, pd.DataFrame]:
    names = preset_names()
    ev = pd.DataFrame([
        {"dataset": ds, "time (ms)": e.get("time_ms"), "× floor": e.get("x_floor"), "optimality": e.get("optimality"),
         "best optimality": e.get("best_optimality"),
         "best by": label(e.get("best_optimality_strategy", ""), names),
         "held-out decrease": e.get("heldout_decrease"), "best held-out decrease": e.get("best_heldout_decrease"),
         "best by ": label(e.get("best_heldout_decrease_strategy", ""), names),
         "within 2%": "yes" if e.get("optimality_within") and e.get("heldout_decrease_within") else "NO"}
        for ds, e in rec.evidence.items() if isinstance(e, dict)
    ])
    ru = rec.runners_up[["rank", "strategy", "preset", "time_ms", "x_floor", "reason"]].rename(
        columns={"time_ms": "median time (ms)", "x_floor": "× floor"})
    return ev, ru


def facts_rows_html(facts: dict) -> list[str]:
    """A facts table's rows (name, value), every string escaped."""
    return [f'<tr><th class="row">{_esc(k)}</th><td class="text">{_esc(v)}</td></tr>' for k, v in facts.items()]


def figure_html(r, tag: str) -> list[str]:
    """A figure under a ``tag`` heading, its PNG embedded, or its note when it was not drawn."""
    h = [f'<{tag} id="{_esc(r.name)}">{_esc(r.title)}</{tag}>']
    if r.fig is None or not r.png:
        return h + [f'<p class="note">{_esc(r.note or "This figure was not drawn.")}</p>']
    data = base64.b64encode(r.png).decode("ascii")
    return h + [f'<figure><img alt="{_esc(r.title)}" src="data:image/png;base64,{data}">'
                f"<figcaption>{_esc(r.caption)}</figcaption></figure>"]


def figure_markdown(r, heading: str) -> list[str]:
    """A figure under a ``heading`` (``##``, ``###``), linked as ``figures/<name>.png``, or its note."""
    m = [f"{heading} {_md_esc(r.title)}", ""]
    if r.fig is None or not r.png:
        return m + [f"> {_md_esc(r.note or 'This figure was not drawn.')}\n"]
    return m + [f"![{_md_esc(r.title)}](figures/{r.name}.png)", "", _md_esc(r.caption), ""]


def _html_training_only(training, db: str, command: str, generated: str, note: str) -> str:
    from harness.report.training import section_html

    h = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
         '<meta name="viewport" content="width=device-width, initial-scale=1">',
         "<title>growbench report</title>", f"<style>{CSS}</style></head><body>",
         "<h1>growbench report</h1>",
         f"<p>Regenerate with:</p><pre>{_esc(command)}</pre><p>Generated {_esc(generated)} from "
         f"<code>{_esc(db)}</code>.</p>", f'<p class="note">{_esc(note)}</p>', section_html(training),
         "</body></html>"]
    return "\n".join(h) + "\n"


def _markdown_training_only(training, db: str, command: str, generated: str, note: str) -> str:
    from harness.report.training import section_markdown

    m = ["# growbench report", "", "Regenerate with:", "", "```bash", command, "```", "",
         f"Generated {generated} from `{db.replace('`', '')}`. The same report as one self-contained page: "
         "[report.html](report.html).", "", f"> {_md_esc(note)}", "", section_markdown(training)]
    return "\n".join(m) + "\n"


def _html(results, rec, rec_json, facts, summary, fails, command, generated, training=None) -> str:
    names = preset_names()
    h = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
         '<meta name="viewport" content="width=device-width, initial-scale=1">',
         "<title>growbench ablation report</title>", f"<style>{CSS}</style></head><body>",
         "<h1>growbench ablation report</h1>",
         f"<p>Regenerate with:</p><pre>{_esc(command)}</pre><p>Generated {_esc(generated)}.</p>",
         f"<p>{_esc(NAMING)}</p>",
         "<h2>Database</h2>", "<table>"]
    h += facts_rows_html(facts)
    h.append("</table>")
    if facts["failed"]:
        h.append(f'<p class="note">{facts["failed"]} of {facts["runs"]} runs failed: see '
                 '<a href="#failed">failed runs</a>.</p>')
    if training is not None:
        h.append('<p>The database also holds training runs: see <a href="#training">Growth during '
                 'training</a>.</p>')

    h.append("<h2>Recommended default strategy</h2>")
    if rec is None or rec.spec is None:
        why = rec_json.get("error") or "no growth strategy is eligible (never failed and ran on every dataset)"
        h.append(f'<p class="note">No recommendation: {_esc(why)}</p>')
    if rec is not None:
        if rec.spec is not None:
            tag = f" (preset <b>{_esc(names[rec.spec])}</b>)" if rec.spec in names else ""
            fb = ' <span class="note">fallback: no strategy meets the rule</span>' if rec.fallback else ""
            h.append(f'<p class="choice">Choice: <code>{_esc(rec.spec)}</code>{tag}{fb}, median time '
                     f'{rec.evidence["median_time_ms"]:.3g} ms.</p>')
        h.append(f"<p><b>Rule.</b> {_esc(rec.rule)}</p>")
        h.append("<p>Reference configurations: " + "; ".join(f"<b>{_esc(ds)}</b>: {_esc(d)}"
                                                                for ds, d in rec.cells.items()) + ".</p>")
        ev, ru = _rec_tables(rec)
        if rec.spec is not None:
            h += ["<h3>Evidence (medians over seeds)</h3>", _html_table(ev)]
        h += ["<h3>Runners-up, by median time, with the reason they lost</h3>"]
        if rec.spec is not None:
            h.append(f'<p class="note">{_esc(rank_note(rec))}</p>')
        h.append(_html_table(ru, "{:.3g}", wide_text=("reason",)))

    for r in results:
        h += figure_html(r, "h2")

    h += ["<h2>Summary: medians per dataset, device and strategy</h2>",
          "<p>Times in ms (medians over the runs of every configuration of that dataset); <code>x_floor</code> = "
          "t_total / t_floor; optimality and held-out decrease are medians.</p>",
          '<div class="small">' + _html_table(summary.rename(columns=lambda c: c.replace("_", " ")), "{:.3g}")
          + "</div>"]
    h += ['<h2 id="failed">Failed runs</h2>',
          _html_table(fails, wide_text=("error",)) if len(fails) else "<p>None: every run succeeded.</p>"]
    if training is not None:
        from harness.report.training import section_html

        h.append(section_html(training))
    h.append("</body></html>")
    return "\n".join(h) + "\n"


def _markdown(results, rec, rec_json, facts, summary, fails, command, generated, training=None) -> str:
    names = preset_names()
    m = ["# growbench ablation report", "", "Regenerate with:", "", "```bash", command, "```", "",
         f"Generated {generated}. The same report as one self-contained page: [report.html](report.html).", "",
         _md_esc(NAMING), "",
         "## Database", "", _md_table(pd.DataFrame({"": list(facts), "value": [str(v) for v in facts.values()]}))]
    if facts["failed"]:
        m.append(f"**{facts['failed']} of {facts['runs']} runs failed**: see [failed runs](#failed-runs).\n")
    if training is not None:
        m.append("The database also holds training runs: see [Growth during training](#growth-during-training).\n")
    m += ["## Recommended default strategy", ""]
    if rec is None or rec.spec is None:
        why = rec_json.get("error") or "no growth strategy is eligible (never failed and ran on every dataset)"
        m.append(f"No recommendation: {_md_esc(why)}\n")
    if rec is not None:
        if rec.spec is not None:
            tag = f" (preset **{_md_esc(names[rec.spec])}**)" if rec.spec in names else ""
            fb = " — *fallback: no strategy meets the rule*" if rec.fallback else ""
            m.append(f"Choice: `{rec.spec.replace('`', '')}`{tag}{fb}, median time "
                     f"{rec.evidence['median_time_ms']:.3g} ms.\n")
        m.append(f"**Rule.** {_md_esc(rec.rule)}\n")
        m.append("Reference configurations: " + "; ".join(f"**{_md_esc(ds)}**: {_md_esc(d)}"
                                                            for ds, d in rec.cells.items()) + ".\n")
        ev, ru = _rec_tables(rec)
        if rec.spec is not None:
            m += ["### Evidence (medians over seeds)", "", _md_table(ev)]
        m += ["### Runners-up, by median time, with the reason they lost", ""]
        if rec.spec is not None:
            m += [_md_esc(rank_note(rec)), ""]
        m.append(_md_table(ru))
    for r in results:
        m += figure_markdown(r, "##")
    m += ["## Summary: medians per dataset, device and strategy", "",
          "Also in [summary.csv](summary.csv). Times in ms.", "", _md_table(summary), "## Failed runs", "",
          _md_table(fails) if len(fails) else "None: every run succeeded.\n"]
    if training is not None:
        from harness.report.training import section_markdown

        m += ["", section_markdown(training)]
    return "\n".join(m)
