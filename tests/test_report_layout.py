"""The report reads at a laptop's widths, 1280 and 800 px (issue 38, item 7), measured in a real browser.

At 1280 px the lead table clipped its runner-up column, and at 800 px specs broke inside a component
(``normal+hol|dout``). The report is built from the committed sweep (``reports/runs.csv``, the specs and datasets
a reader meets) with training runs beside it, opened in headless Chromium with a script that writes what it
measures into the page, and read back with ``--dump-dom``. Without Chromium (``apt-get install chromium``) the
browser tests skip, saying so; the wrapping rules themselves are checked without a browser.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from growbench.harness.report.build import build_report
from growbench.harness.report.render import has_joints, html_breakable, html_header
from growbench.harness.store.results import ResultsDB

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from test_train_report import fixture_rows as training_rows  # noqa: E402
from test_train_report import write_train_db  # noqa: E402

WIDTHS = (1280, 800)
CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
# Writes into the page: the window's width, the page's, each table against its box (with its heading), every span
# of a spec that the browser broke inside, every cell whose content overflows it. Folded sections are opened
# first: a closed <details> lays nothing out.
MEASURE = """
(function () {
  document.querySelectorAll("details").forEach(function (d) { d.open = true; });
  function heading(el) {
    for (var e = el; e; e = e.parentElement) {
      for (var p = e.previousElementSibling; p; p = p.previousElementSibling) {
        if (/^H[1-6]$/.test(p.tagName)) return p.textContent;
      }
    }
    return "";
  }
  var out = {width: window.innerWidth, page: document.documentElement.scrollWidth, tables: [], broken: [],
             cells: [], specs: 0};
  document.querySelectorAll("div.wrap").forEach(function (w) {
    out.tables.push({heading: heading(w), small: w.classList.contains("small"),
                     table: w.querySelector("table").scrollWidth, box: w.clientWidth,
                     scrolls: getComputedStyle(w).overflowX});
  });
  document.querySelectorAll("span.nw").forEach(function (s) {
    out.specs += 1;
    if (s.getClientRects().length > 1) out.broken.push(s.textContent);
  });
  document.querySelectorAll("td, th").forEach(function (c) {
    if (c.scrollWidth > c.clientWidth + 1) out.cells.push(c.textContent.slice(0, 80));
  });
  var pre = document.createElement("pre");
  pre.id = "growbench-measure";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
"""


# ------------------------------------------------------------------ the wrapping rules, without a browser
@pytest.mark.parametrize("text, pieces", [
    ("gram/ridge/full+metric/normal+holdout+shrink:bracket",
     ["gram/", "ridge/", "full+", "metric/", "normal+", "holdout+", "shrink:", "bracket"]),
    ("minilm-recovery:layer=4:head=7", ["minilm-recovery:", "layer=4:", "head=7"]),
    ("mean-input/ridge/full:grid", ["mean-input/", "ridge/", "full:", "grid"]),
])
def test_a_spec_wraps_only_after_its_slashes_pluses_and_colons(text, pieces):
    out = str(html_breakable(f"runs {text} here"))
    assert re.findall(r'<span class="nw">([^<]*)</span>', out) == pieces
    assert out.count("<wbr>") == len(pieces) - 1
    # Copied from the page, the text is the same: the markup adds no character.
    assert html.unescape(re.sub(r"<[^>]+>", "", out)) == f"runs {text} here"


@pytest.mark.parametrize("text", ["+0.66% [-0.37, +1.6]", "cpu, d_e ≤ 128: does not generalise", "e.g. a/ b",
                                  "default[+metric, bracket]"])
def test_signs_sentences_and_brackets_are_left_alone(text):
    assert not has_joints(text) and str(html_breakable(text)) == str(html.escape(text, quote=True)).replace(
        "&#x27;", "&#39;")


def test_database_text_stays_escaped_when_it_wraps():
    hostile = "<script>alert('x')</script>/gram/solve:<b>x</b>"
    out = str(html_breakable(hostile))
    assert "<script>" not in out and "<b>" not in out and "&lt;script&gt;" in out
    assert html.unescape(re.sub(r"<(/?span[^>]*|wbr)>", "", out)) == hostile
    assert str(html_header("line_search_ms <i>")) == "line_<wbr>search_<wbr>ms &lt;i&gt;"


# ------------------------------------------------------------------ in a browser
def _committed_db(path: Path) -> Path:
    """The committed sweep's runs, stored as the sweep stores them, and the training tests' runs beside them."""
    runs = pd.read_csv(ROOT / "reports" / "runs.csv", keep_default_na=False, na_values=[""])
    with ResultsDB(path) as db:
        for r in runs.to_dict("records"):
            db.write({k: v for k, v in r.items() if not (isinstance(v, float) and np.isnan(v))})
    return write_train_db(path, training_rows())


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    if CHROMIUM is None:
        pytest.skip("no Chromium on PATH (apt-get install chromium): the report's layout is measured in a browser")
    root = tmp_path_factory.mktemp("layout")
    build_report(_committed_db(root / "growbench.sqlite"), root / "out", svg=False)
    text = (root / "out" / "report.html").read_text(encoding="utf-8")
    measured = root / "measured.html"
    measured.write_text(text.replace("</body>", f"<script>{MEASURE}</script></body>"), encoding="utf-8")
    return measured


def _measure(page: Path, width: int, tmp_path: Path) -> dict:
    """What the page's script measured in headless Chromium, the window ``width`` px wide."""
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
         f"--window-size={width},2000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=180)
    found = re.search(r'<pre id="growbench-measure">(.*?)</pre>', done.stdout, re.S)
    assert found, f"Chromium wrote no measurement (exit {done.returncode}): {done.stderr[-500:]}"
    return json.loads(html.unescape(found.group(1)))


@pytest.mark.parametrize("width", WIDTHS)
def test_the_report_reads_at_a_laptops_width(page, tmp_path, width):
    """No column clipped, no spec broken inside a component, the page no wider than the window.

    Every table of prose and specs fits its box at both widths. The two tables of raw medians (the summary, and the
    training's medians per variant: marked small, a dozen numeric columns each) fit at 1280 px and, at 800 px, may
    scroll inside their own box, which says so with a scroll bar: nothing is cut off.
    """
    m = _measure(page, width, tmp_path)
    assert m["width"] <= width and m["page"] <= m["width"], m["page"]
    assert m["specs"] > 100, "the specs are not marked up to wrap at their components"
    assert not m["broken"], f"specs broken inside a component: {m['broken'][:5]}"
    assert not m["cells"], f"cells whose content overflows them: {m['cells'][:5]}"
    assert len(m["tables"]) >= 10
    for t in m["tables"]:
        if t["small"] and width < 1280:
            assert t["scrolls"] == "auto", t
            continue
        assert t["table"] <= t["box"], f"{t['heading']}: the table is {t['table']} px in a {t['box']} px box"
    headings = {t["heading"] for t in m["tables"]}
    assert {"What to use", "Evidence (held-out gain over seeds, diagnostics as medians)"} <= headings
