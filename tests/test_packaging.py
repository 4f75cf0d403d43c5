"""Packaging: one import name (growbench) beside Hugging Face's, and torch declared as a supported range.

An exact pin (``torch==X``) makes pip refuse a torch the user already has (a GPU machine's
``2.11.0+cu130``, say); CI keeps its fast, reproducible install through ``.ci/constraints.txt``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
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


# ------------------------------------------------------------------ one import name
FOLDERS = ("strategies", "models", "datasets", "harness")


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory) -> list[str]:
    """The file names inside the wheel that ``pip`` builds from this checkout."""
    import shutil
    import zipfile

    # Built from a copy of the tracked-looking files: setuptools builds in the source's build/, where files
    # of an earlier build (a module since removed) would otherwise end up in this wheel too.
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md", *FOLDERS):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
        copy(ROOT / name, source / name, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                            if (ROOT / name).is_dir() else {}))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                            "-w", str(out), str(source)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = out.glob("growbench-*.whl")
    with zipfile.ZipFile(wheel) as z:
        return z.namelist()


def test_the_wheel_puts_only_growbench_at_the_top_of_site_packages(wheel_names):
    top = {name.split("/")[0] for name in wheel_names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"growbench"}, sorted(top)
    assert not top & set(FOLDERS)


def test_the_wheel_holds_every_source_file_and_data_file_under_growbench(wheel_names):
    # The package list in pyproject.toml is explicit: a new subfolder left out of it would be missing here.
    expected = {f"growbench/{p.relative_to(ROOT).as_posix()}" for folder in FOLDERS
                for p in (ROOT / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert expected - set(wheel_names) == set()
    assert "growbench/strategies/default.json" in wheel_names
    assert any(n.startswith("growbench/harness/report/templates/") for n in wheel_names)


def test_the_checkout_exposes_no_regular_package_named_like_another_library():
    # From the checkout's root, Python puts the current folder first on the path: a folder with an
    # __init__.py there would shadow the installed library of that name. Without one it is a namespace
    # portion, which any installed package outranks and which transformers does not take for a library.
    from importlib.machinery import PathFinder

    for folder in ("datasets", "models", "harness"):
        spec = PathFinder.find_spec(folder, [str(ROOT)])
        assert spec is not None and spec.origin in (None, "namespace") and spec.loader is None, (folder, spec)


@pytest.mark.parametrize("cwd", ["checkout", "elsewhere"])
def test_hugging_face_datasets_and_growbench_import_side_by_side(cwd, tmp_path):
    pytest.importorskip("datasets", reason="Hugging Face datasets is in the test extra")
    code = textwrap.dedent("""
        import datasets
        import growbench.datasets.registry as registry
        from growbench import strategies
        from transformers.utils import is_datasets_available

        assert hasattr(datasets, "load_dataset") and datasets.__version__, datasets.__file__
        assert "site-packages" in datasets.__file__, datasets.__file__
        assert registry.make_dataset("teacher", 8, 6).name == "teacher"
        assert strategies.make("default").spec == "default"
        assert is_datasets_available()
        print(datasets.__file__)
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT if cwd == "checkout" else tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
