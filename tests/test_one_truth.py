"""One truth for the default: the committed evidence, the shipped choices per regime and the README agree."""

from __future__ import annotations

import json
import re
from pathlib import Path

from growbench import strategies

ROOT = Path(__file__).resolve().parent.parent
COMMITTED_REPORTS = ("reports", "reports/cuda")


def test_recommendation_default_json_and_readme_name_the_same_specs():
    regimes = json.loads((ROOT / "strategies" / "default.json").read_text())["regimes"]
    shipped = {key: entry["spec"] for key, entry in regimes.items()}
    evidence = {}
    for folder in COMMITTED_REPORTS:  # the CPU reference and the GPU's: each regime's evidence in one of them
        committed = json.loads((ROOT / folder / "recommendation.json").read_text())["regimes"]
        assert not set(committed) & set(evidence), f"{folder} repeats a regime"
        evidence.update(committed)
    assert set(shipped) == set(evidence), "default.json and the committed evidence cover different regimes"
    for key, spec in shipped.items():
        assert strategies.canonical(spec) == strategies.canonical(evidence[key]["spec"]) == spec, key
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Default strategy", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`([a-z0-9+/:\-]+/[a-z0-9+/:\-]+)`", section))
    assert named == set(shipped.values()), f"the README's default section names {sorted(named)}, default.json " \
                                           f"{sorted(set(shipped.values()))}"
    for folder in COMMITTED_REPORTS:
        report = (ROOT / folder / "report.md").read_text()
        what_to_use = report.split("## What to use", 1)[1].split("\n## ", 1)[0]
        assert all(spec in what_to_use for spec in shipped.values()), folder
