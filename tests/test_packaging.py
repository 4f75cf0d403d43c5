"""Packaging: torch is declared as a supported range, and CI pins a version inside it.

An exact pin (``torch==X``) makes pip refuse a torch the user already has (a GPU machine's
``2.11.0+cu130``, say); CI keeps its fast, reproducible install through ``.ci/constraints.txt``.
"""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU_BUILD = "2.11.0"  # the GPU machine's torch (2.11.0+cu130)

packaging_requirements = pytest.importorskip(
    "packaging.requirements", reason="needs `packaging` to parse version specifiers"
)
from packaging.version import Version  # noqa: E402  (after the importorskip above)


def _torch_requirement():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    reqs = [packaging_requirements.Requirement(d) for d in deps]
    torch_reqs = [r for r in reqs if r.name == "torch"]
    assert len(torch_reqs) == 1, deps
    return torch_reqs[0]


def _public(v: str) -> str:
    """``2.13.0+cpu`` -> ``2.13.0``: the local build label says nothing about the API."""
    return Version(v).public


def test_torch_is_a_range_containing_installed_and_gpu_builds():
    spec = _torch_requirement().specifier
    ops = {s.operator for s in spec}
    assert not ops & {"==", "==="}, f"torch is pinned, not a range: {spec}"
    assert ">=" in ops and "<" in ops, f"torch needs a lower and an upper bound: {spec}"
    installed = version("torch")
    assert spec.contains(_public(installed), prereleases=True), (installed, str(spec))
    assert spec.contains(GPU_BUILD), str(spec)
    # The local label must not matter either (pip compares public versions).
    assert spec.contains(f"{GPU_BUILD}+cu130"), str(spec)
    # Below the next major, and not below what the code needs: transformers 5 (what pip resolves
    # transformers>=4.41 to) disables its torch models below 2.6, and .ci/torch-floor tests 2.6.
    assert not spec.contains("3.0.0"), str(spec)
    assert not spec.contains("2.5.1"), str(spec)


def test_ci_constraints_pin_torch_inside_the_range():
    spec = _torch_requirement().specifier
    lines = [ln.split("#", 1)[0].strip() for ln in (ROOT / ".ci" / "constraints.txt").read_text().splitlines()]
    pins = [packaging_requirements.Requirement(ln) for ln in lines if ln]
    torch_pins = [p for p in pins if p.name == "torch"]
    assert len(torch_pins) == 1, lines
    (pin,) = torch_pins[0].specifier
    assert pin.operator == "==", str(pin)
    assert spec.contains(_public(pin.version)), (pin.version, str(spec))


def test_ci_installs_with_the_constraints():
    run = (ROOT / ".ci" / "run").read_text()
    installs = [ln for ln in run.splitlines() if re.search(r"pip install .*-e ", ln)]
    assert installs, run
    assert all("-c .ci/constraints.txt" in ln for ln in installs), installs
