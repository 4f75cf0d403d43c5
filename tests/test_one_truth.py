"""One truth for the default: the committed evidence, the shipped choice and the README agree."""

from __future__ import annotations

import json
import re
from pathlib import Path

import strategies

ROOT = Path(__file__).resolve().parent.parent


def test_recommendation_default_json_and_readme_name_the_same_spec():
    shipped = json.loads((ROOT / "strategies" / "default.json").read_text())["spec"]
    evidence = json.loads((ROOT / "reports" / "recommendation.json").read_text())["spec"]
    assert strategies.canonical(shipped) == strategies.canonical(evidence) == shipped
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Default strategy", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`([a-z0-9+/:\-]+/[a-z0-9+/:\-]+)`", section))
    assert named == {shipped}, f"the README's default section names {sorted(named)}, default.json {shipped}"
    report = (ROOT / "reports" / "report.md").read_text()
    assert shipped in report
