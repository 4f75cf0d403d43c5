"""A component from outside the repository, added through ``strategies.register`` alone.

The plugin is a module written to a temporary folder (outside the repository): one class,
registered with the decorator. It must then be usable everywhere a built-in one is: ``make``,
``specs``, the CLI (named by ``GROWBENCH_PLUGINS``) and a sweep's worker processes.
"""

from __future__ import annotations

import importlib
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import anisotropic_X, attention_loss, factors, grad_of
from helpers import GROWBENCH

from growbench import strategies
from growbench.strategies.registry import REGISTRY, outside_modules

PLUGIN = "growbench_test_plugin"
SPEC = "scaled-gram/solve/full/normal:newton"

# A new averaging formula: Gram's direction times a constant. The step normalises P by
# ‖X P Xᵀ‖, so its growth must equal Gram's: a property the test can check exactly.
PLUGIN_SOURCE = textwrap.dedent('''
    from growbench import strategies
    from growbench.strategies.averaging import Gram


    @strategies.register("averaging")
    class ScaledGram(Gram):
        """Gram's direction times three."""

        name = "scaled-gram"

        def direction(self, stats, log, info):
            return 3.0 * super().direction(stats, log, info)
''')


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """The plugin module importable from ``tmp_path``; the registry restored afterwards."""
    (tmp_path / f"{PLUGIN}.py").write_text(PLUGIN_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    saved = {axis: dict(table) for axis, table in REGISTRY.items()}
    sys.modules.pop(PLUGIN, None)
    importlib.import_module(PLUGIN)
    yield tmp_path
    for axis, table in saved.items():
        REGISTRY[axis].clear()
        REGISTRY[axis].update(table)
    sys.modules.pop(PLUGIN, None)


def test_outside_component_grows_like_the_formula_it_rescales(plugin):
    assert SPEC in strategies.specs()
    assert strategies.canonical(SPEC) == SPEC
    assert outside_modules() == [PLUGIN]
    b, d_s, d_e, d_k, p = 4, 12, 10, 2, 3
    X = anisotropic_X(b, d_s, d_e, cond=30.0, seed=1).double()
    loss = attention_loss(b, d_s, seed=2)
    W_Q, W_K = (w.double() for w in factors(d_e, d_k, seed=3))
    S = (X @ W_Q) @ (X @ W_K).mT / d_k**0.5
    G = grad_of(loss, S)
    ours = strategies.make(SPEC).grow(W_Q, W_K, X, G, p, loss)
    gram = strategies.make("gram/solve/full/normal:newton").grow(W_Q, W_K, X, G, p, loss)
    assert ours.spec == SPEC
    assert ours.loss_after < ours.loss_before
    torch.testing.assert_close(ours.dZ, gram.dZ, rtol=1e-9, atol=1e-12)
    assert ours.lam == pytest.approx(gram.lam, rel=1e-9)


def test_register_refuses_a_taken_name_and_a_name_a_spec_cannot_hold(plugin):
    from growbench.strategies.averaging import Gram

    with pytest.raises(ValueError, match="already registered"):
        strategies.register("averaging", "gram")(type("Other", (Gram,), {}))
    for bad in ("Upper", "a/b", "a:b", "with space", ""):
        with pytest.raises(ValueError):
            strategies.register("averaging", bad)(type("Bad", (Gram,), {}))
    with pytest.raises(ValueError, match="unknown axis"):
        strategies.register("colour", "red")


def _cli(args: list[str], plugin_dir: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "GROWBENCH_PLUGINS": PLUGIN, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(plugin_dir), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([*GROWBENCH, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def test_cli_lists_and_runs_an_outside_component_in_worker_processes(plugin, tmp_path):
    listed = _cli(["list", "--json"], plugin, tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert SPEC in json.loads(listed.stdout)["strategies"]
    db = tmp_path / "runs.sqlite"
    run = _cli(["run", "--preset", "smoke", "--strategies", f"{SPEC},formula4", "--datasets", "teacher",
                "--seeds", "0", "--jobs", "2", "--db", str(db), "--no-cache", "--no-progress"], plugin, tmp_path)
    assert run.returncode == 0, run.stderr
    with sqlite3.connect(db) as con:
        rows = dict(con.execute("SELECT strategy, status FROM runs").fetchall())
    assert rows.get(SPEC) == "ok", rows


def test_an_unimportable_plugin_is_one_line_and_exit_2(tmp_path):
    env = {**os.environ, "GROWBENCH_PLUGINS": "no_such_growbench_plugin"}
    out = subprocess.run([*GROWBENCH, "list"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "no_such_growbench_plugin" in out.stderr
