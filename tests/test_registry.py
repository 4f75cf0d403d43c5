"""The registry: presets, the spec grid, round trips, the default from ``default.json``."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from growbench import strategies

SEED_SETTING = {
    "formula1": "per-sample/pinv/full/normal:grid",
    "formula2": "gram/pinv/full/normal:grid",
    "formula3": "mean-input/pinv/full/normal:grid",
    "formula4": "gram/solve/full/normal:grid",
}


def test_presets_contain_required_names():
    presets = strategies.presets()
    for name in ("formula1", "formula2", "formula3", "formula4", "joint", "random", "zero", "gradmax", "default"):
        assert name in presets
    for name in ("random", "zero", "gradmax"):
        assert presets[name] == name


@pytest.mark.parametrize("name", list(SEED_SETTING))
def test_formula_presets_are_the_seed_setting(name):
    assert strategies.presets()[name] == SEED_SETTING[name]
    assert strategies.make(name).spec == SEED_SETTING[name]


def test_joint_preset_uses_joint_averaging():
    assert strategies.presets()["joint"].startswith("joint/")


def test_specs_are_the_full_grid_plus_baselines():
    specs = strategies.specs()
    assert len(specs) == len(set(specs))
    grid = {
        f"{a}/{i}/{t}{m}/{ls}{h}{sh}{dm}:{meth}"
        for a, i, t, m, ls, h, sh, dm, meth in itertools.product(
            ["per-sample", "gram", "mean-input", "joint"], ["pinv", "solve", "ridge"], ["full", "rsvd"],
            ["", "+metric"], ["normal", "fast"], ["", "+holdout"], ["", "+shrink"], ["", "+damp"],
            ["grid", "bounded", "newton", "quadratic", "bracket"],
        )
    }
    assert set(specs) == grid | {"random", "zero", "gradmax"}
    for name, spec in strategies.presets().items():
        assert spec in specs, name


@pytest.mark.parametrize("spec", strategies.specs())
def test_every_spec_round_trips(spec):
    s = strategies.make(spec)
    assert s.spec == spec
    assert strategies.canonical(spec) == spec


def test_default_is_read_from_default_json():
    path = Path(strategies.__file__).parent / "default.json"
    spec = json.loads(path.read_text())["regimes"]["cpu/small"]["spec"]
    assert strategies.make("default").resolve("cpu", 32).spec == spec
    assert strategies.presets()["default"] == spec
    assert strategies.default_spec() == spec
    assert spec in strategies.specs()


def test_spec_normalisation_and_preset_names():
    assert strategies.make("  GRAM/Solve/RSVD+metric/Fast:Newton ").spec == "gram/solve/rsvd+metric/fast:newton"
    for name, spec in strategies.presets().items():
        made = strategies.make(name)
        assert (made.resolve("cpu", 32) if name == "default" else made).spec == spec


def test_component_options_reach_the_components():
    s = strategies.make(
        "joint/solve/rsvd+metric/normal:newton",
        averaging={"tol": 1e-9, "maxiter": 7},
        inverse={"method": "lu", "rtol": 1e-8},
        truncation={"oversample": 3, "n_iter": 1, "seed": 11},
        line_search={"newton_steps": 2},
    )
    assert (s.averaging.tol, s.averaging.maxiter) == (1e-9, 7)
    assert (s.averaging.inverse.method, s.averaging.inverse.rtol) == ("lu", 1e-8)
    assert (s.truncation.oversample, s.truncation.n_iter, s.truncation.seed, s.truncation.metric) == (3, 1, 11, True)
    assert (s.line_search.newton_steps, s.line_search.method) == (2, "newton")


@pytest.mark.parametrize("spec, kw, match", [
    ("gram/pinv/full/fast:grid", {"inverse": {"rtol": 2.0}}, "rtol"),
    ("gram/solve/full/fast:grid", {"inverse": {"method": "qr"}}, "cholesky"),
    ("joint/solve/full/fast:grid", {"averaging": {"tol": 0.0}}, "tol"),
    ("gram/pinv/rsvd/fast:grid", {"truncation": {"oversample": -1}}, "oversample"),
    ("gram/pinv/full/fast:grid", {"line_search": {"lam_min": 5.0, "lam_max": 1.0}}, "lam_min"),
    ("gram/pinv/full/fast:grid", {"baseline": {"std": 0.1}}, "baseline"),
    ("random", {"averaging": {"tol": 0.1}}, "baseline"),
    ("random", {"baseline": {"std": -1.0}}, "std"),
])
def test_bad_component_options_raise(spec, kw, match):
    with pytest.raises(ValueError, match=match):
        strategies.make(spec, **kw)
