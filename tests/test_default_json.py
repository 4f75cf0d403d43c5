"""``strategies/default.json`` under hostile edits (issue 12, item 4).

A damaged file warns once, in one line naming the file and the problem, and the
``default`` preset falls back to the built-in spec, so that ``list`` and runs of other
strategies keep working; ``recommend --write`` refuses a recursive or baseline choice.
The real file is never touched: ``DEFAULT_FILE`` is pointed at a file under ``tmp_path``
(an absolute path, which ``importlib.resources``' ``joinpath`` returns as is).
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import warnings
from pathlib import Path

import pandas as pd
import pytest

import growbench.strategies.spec as reg
from growbench import strategies
from growbench.harness import recommend as R
from growbench.harness.cli import main as cli_main

BUILTIN = "gram/solve/rsvd+metric/normal:bracket"

# name -> (file content, or None for no file; a word the warning must contain)
DAMAGED = {
    "missing": (None, "not found"),
    "corrupt": ('{"spec": "gram/solve/full/fast:grid"', "invalid JSON"),
    "empty": ("", "invalid JSON"),
    "no_spec_key": ('{"rule": "fastest"}', '"spec"'),
    "json_list": ('["gram/solve/full/fast:grid"]', "list"),
    "recursive": ('{"spec": "default"}', "recursive"),
    "recursive_spelt_otherwise": ('{"spec": "  Default "}', "recursive"),
    "baseline_zero": ('{"spec": "zero"}', "baseline"),
    "baseline_random": ('{"spec": "random"}', "baseline"),
    "baseline_gradmax": ('{"spec": "gradmax"}', "baseline"),
    "not_a_string": ('{"spec": 3}', "string"),
    "null_spec": ('{"spec": null}', "string"),
    "unknown_spec": ('{"spec": "gram/nope/full/fast:grid"}', "unknown"),
    "binary": (b"\xff\xfe\x00garbage", "unreadable"),
    "regimes_not_an_object": ('{"regimes": ["gram/solve/full/fast:grid"]}', '"regimes"'),
    "regimes_empty": ('{"regimes": {}}', '"regimes"'),
    "regime_unknown": ('{"regimes": {"tpu/small": {"spec": "formula2"}}}', "tpu/small"),
    "regime_band_unknown": ('{"regimes": {"cpu/huge": {"spec": "formula2"}}}', "cpu/huge"),
    "regime_without_spec": ('{"regimes": {"cpu/small": {"rule": "x"}}}', '"spec"'),
    "regime_baseline": ('{"regimes": {"cpu/small": {"spec": "formula2"}, "cuda/large": {"spec": "zero"}}}',
                        "cuda/large"),
    "regime_recursive": ('{"regimes": {"cpu/medium": {"spec": "default"}}}', "recursive"),
}


@pytest.fixture
def default_at(tmp_path, monkeypatch):
    """Point the registry at ``tmp_path/default.json`` with the given content; forget earlier warnings."""
    monkeypatch.setattr(reg, "_WARNED", set())

    def put(content: str | bytes | None) -> Path:
        path = tmp_path / "default.json"
        if isinstance(content, bytes):
            path.write_bytes(content)
        elif content is not None:
            path.write_text(content)
        monkeypatch.setattr(reg, "DEFAULT_FILE", str(path))
        return path

    return put


def test_builtin_default_is_a_growth_spec_and_the_committed_file_is_valid(recwarn):
    assert reg.BUILTIN_DEFAULT == BUILTIN
    assert BUILTIN in strategies.specs() and "baseline" not in strategies.parse(BUILTIN)
    committed = json.loads((Path(strategies.__file__).parent / "default.json").read_text())
    for key, entry in committed["regimes"].items():
        regime = reg.Regime.parse(key)
        choice = reg.default_choice(regime.device, regime.width)
        assert choice.spec == strategies.canonical(entry["spec"]) and choice.source == regime and not choice.note
    assert not [w for w in recwarn if issubclass(w.category, reg.DefaultFileWarning)]


@pytest.mark.parametrize("case", list(DAMAGED))
def test_damaged_file_warns_once_and_falls_back(default_at, case):
    content, word = DAMAGED[case]
    path = default_at(content)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # Every way of reaching the default: one warning in all, not one per call.
        assert strategies.default_spec() == BUILTIN
        assert strategies.presets()["default"] == BUILTIN
        assert strategies.make("default").resolve("cpu", 32).spec == BUILTIN
        assert strategies.canonical("DEFAULT") == BUILTIN
        assert strategies.make("formula2").spec == "gram/pinv/full/normal:grid"
    ours = [w for w in caught if issubclass(w.category, reg.DefaultFileWarning)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    msg = str(ours[0].message)
    assert "\n" not in msg and str(path) in msg and word in msg and BUILTIN in msg
    # The formatted warning, as a terminal shows it, is one line too (no source line of registry.py), led by the
    # file's path in angle brackets: the name linecache never opens (issue 38: a FIFO there hung every command).
    shown = warnings.formatwarning(ours[0].message, ours[0].category, ours[0].filename, ours[0].lineno)
    assert shown.count("\n") == 1 and shown.startswith(f"<{path}>:0: DefaultFileWarning: {path}: ")


def test_a_new_problem_warns_again(default_at):
    default_at('{"spec": "zero"}')
    with pytest.warns(reg.DefaultFileWarning, match="baseline"):
        strategies.default_spec()
    default_at('{"spec": "default"}')
    with pytest.warns(reg.DefaultFileWarning, match="recursive"):
        strategies.default_spec()


@pytest.mark.parametrize("spec, expected", [
    ("formula2", "gram/pinv/full/normal:grid"),
    ("  GRAM/Solve/RSVD+metric/Fast:Newton ", "gram/solve/rsvd+metric/fast:newton"),
    ("joint", strategies.presets()["joint"]),
])
def test_valid_file_is_canonicalised_without_warning(default_at, recwarn, spec, expected):
    default_at(json.dumps({"spec": spec, "rule": "anything", "evidence": {}}))
    assert strategies.default_spec() == expected and strategies.make("default").resolve("cuda", 4096).spec == expected
    assert not [w for w in recwarn if issubclass(w.category, reg.DefaultFileWarning)]


@pytest.mark.parametrize("spec, word", [
    ("default", "recursive"), ("zero", "baseline"), ("random", "baseline"), ("gradmax", "baseline"),
    (None, "string"), (["gram/solve/full/fast:grid"], "string"), ("gram/solve/full", "unknown"),
])
def test_check_default_choice_refuses(spec, word):
    with pytest.raises(ValueError, match=word) as e:
        reg.check_default_choice(spec)
    assert "\n" not in str(e.value) and "valid specs are" not in str(e.value)


@pytest.mark.parametrize("case", ["missing", "corrupt", "json_list", "recursive", "baseline_zero"])
def test_list_works_with_a_damaged_file(default_at, capsys, case):
    path = default_at(DAMAGED[case][0])
    with pytest.warns(reg.DefaultFileWarning, match="default.json"):
        assert cli_main(["list"]) == 0
    out = capsys.readouterr().out
    assert f"default    {BUILTIN}" in out and "formula2" in out
    assert str(path) != str(Path(strategies.__file__).parent / "default.json")

    with pytest.warns(reg.DefaultFileWarning):  # --json too; a fresh warning for a fresh process
        reg._WARNED.clear()
        assert cli_main(["list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["presets"]["default"] == BUILTIN


def test_run_of_another_strategy_works_with_a_missing_file(default_at, tmp_path, capsys):
    default_at(None)
    db = tmp_path / "r.sqlite"
    args = ["run", "--strategies", "formula2", "--datasets", "teacher", "--d-s", "8", "--d-e", "8", "--b", "8",
            "--d-k", "2", "--p", "2", "--seeds", "0", "--n-batches", "2", "--repeats", "1", "--warmup-steps", "3",
            "--db", str(db), "--no-cache", "--no-progress"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", reg.DefaultFileWarning)  # whether list/run touch the default is not the point
        assert cli_main(args) == 0
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT strategy, status FROM runs").fetchall() == [("gram/pinv/full/normal:grid", "ok")]


# ------------------------------------------------------------------ recommend --write
def _fake_recommendation(monkeypatch, spec: str) -> None:
    """Make ``growbench recommend`` choose ``spec`` without a database (the CLI imports these at call time)."""
    rec = R.Recommendation(spec=spec, rule="test rule", fallback=False, tolerance=0.02, datasets=["teacher"],
                           cells={"teacher": "d_e=8"}, table=pd.DataFrame({"strategy": [spec]}), regime="cpu/small")
    monkeypatch.setattr(R, "load_frame", lambda db: None)
    monkeypatch.setattr(R, "recommend_regimes", lambda frame, **kw: {"cpu/small": rec})
    monkeypatch.setattr(R, "format_regimes", lambda recs: f"choice: {recs['cpu/small'].spec}")


@pytest.mark.parametrize("spec, word", [("default", "recursive"), ("DEFAULT", "recursive"), ("zero", "baseline"),
                                        ("random", "baseline"), ("gradmax", "baseline")])
def test_recommend_write_refuses_recursive_or_baseline(tmp_path, monkeypatch, capsys, spec, word):
    _fake_recommendation(monkeypatch, spec)
    target = tmp_path / "default.json"
    target.write_text('{"spec": "formula2"}\n')
    assert cli_main(["recommend", "--db", str(tmp_path / "x.sqlite"), "--write", "--default-file", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and word in err and str(target) in err and "not written" in err
    assert target.read_text() == '{"spec": "formula2"}\n'  # untouched

    with pytest.raises(ValueError, match=word):
        R.write_default(R.Recommendation(spec=spec, rule="", fallback=False, tolerance=0.02, datasets=[], cells={}),
                        tmp_path / "x.sqlite", target)
    assert target.read_text() == '{"spec": "formula2"}\n'


def test_recommend_write_accepts_a_growth_spec(tmp_path, monkeypatch, capsys):
    spec = "gram/solve/rsvd+metric/fast:newton"
    _fake_recommendation(monkeypatch, spec)
    target = tmp_path / "default.json"
    assert cli_main(["recommend", "--db", str(tmp_path / "x.sqlite"), "--write", "--default-file", str(target)]) == 0
    assert json.loads(target.read_text())["regimes"]["cpu/small"]["spec"] == spec
    monkeypatch.setattr(reg, "DEFAULT_FILE", str(target))
    assert strategies.default_spec() == spec
    # The one regime with evidence lends its choice to every other, and says so.
    far = reg.default_choice("cuda", 4096)
    assert far.spec == spec and far.source == reg.REFERENCE_REGIME and "nearest" in far.note


# ------------------------------------------------------------------ recommend --write keeps what it cannot read
PLUGIN_ENTRY = {"spec": "my-averaging/solve/full/normal:newton", "note": "from a plugin, GROWBENCH_PLUGINS unset"}


def test_write_keeps_an_entry_it_cannot_parse_and_says_so(tmp_path, monkeypatch, capsys):
    """A plugin strategy's entry (its component not registered in this process) and a regime of a newer growbench
    were deleted by the next ``--write``, with only a read-time warning: now they stay as they were, and the
    command says it kept them and why it cannot read them."""
    spec = "gram/solve/rsvd+metric/fast:newton"
    _fake_recommendation(monkeypatch, spec)
    target = tmp_path / "default.json"
    target.write_text(json.dumps({"rule": "old", "regimes": {"cpu/small": {"spec": "formula2"},
                                                            "cuda/large": PLUGIN_ENTRY,
                                                            "tpu/small": {"spec": "formula1"}}}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", reg.DefaultFileWarning)  # the read-time warning is not the point here
        assert cli_main(["recommend", "--db", str(tmp_path / "x.sqlite"), "--write",
                         "--default-file", str(target)]) == 0
    regimes = json.loads(target.read_text())["regimes"]
    assert regimes["cuda/large"] == PLUGIN_ENTRY and regimes["tpu/small"] == {"spec": "formula1"}
    assert regimes["cpu/small"]["spec"] == spec
    out = capsys.readouterr().out
    assert "cuda/large: kept as it is (this process cannot read it" in out and "my-averaging" in out
    assert "tpu/small: kept as it is" in out and f"cpu/small: {spec} (was formula2" in out


def test_write_keeps_unknown_top_level_keys(tmp_path, monkeypatch):
    """A hand-edited file's own top-level keys were dropped by ``--write``: now only the keys it writes change."""
    _fake_recommendation(monkeypatch, "gram/solve/rsvd+metric/fast:newton")
    target = tmp_path / "default.json"
    mine = {"comment": "chosen on our cluster", "owner": {"team": "attention", "ticket": 38}}
    target.write_text(json.dumps({"rule": "old", "regimes": {"cpu/medium": {"spec": "formula1"}}, **mine}))
    assert cli_main(["recommend", "--db", str(tmp_path / "x.sqlite"), "--write", "--default-file", str(target)]) == 0
    data = json.loads(target.read_text())
    assert {key: data[key] for key in mine} == mine and data["regimes"]["cpu/medium"] == {"spec": "formula1"}
    assert data["rule"] == "test rule" and list(data)[:4] == ["rule", "regimes", "db", "generated"]


@pytest.mark.parametrize("content, word", [
    ('{"regimes": {"cpu/small": {"spec": ', "not valid JSON"),
    ('["formula2"]', "JSON list"),
    ('{"regimes": ["formula2"]}', '"regimes"'),
    (b"\xff\xfe\x00garbage", "cannot read it"),
])
def test_write_refuses_in_one_line_a_file_it_cannot_read_and_leaves_it(tmp_path, monkeypatch, capsys, content, word):
    """A file ``--write`` cannot read is not replaced (what it holds would be lost): one line naming it, exit 2."""
    _fake_recommendation(monkeypatch, "gram/solve/rsvd+metric/fast:newton")
    target = tmp_path / "default.json"
    if isinstance(content, bytes):
        target.write_bytes(content)
    else:
        target.write_text(content)
    before = target.read_bytes()
    assert cli_main(["recommend", "--db", str(tmp_path / "x.sqlite"), "--write", "--default-file", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and str(target) in err and word in err, err
    assert target.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["default.json"]


def test_write_refuses_a_fifo_without_blocking(tmp_path, monkeypatch, capsys):
    _fake_recommendation(monkeypatch, "gram/solve/rsvd+metric/fast:newton")
    target = tmp_path / "default.json"
    os.mkfifo(target)
    assert cli_main(["recommend", "--db", str(tmp_path / "x.sqlite"), "--write", "--default-file", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a regular file" in err and stat.S_ISFIFO(target.lstat().st_mode)


def test_written_file_names_the_database_the_same_on_every_machine(tmp_path, monkeypatch):
    """``default.json`` recorded ``/tmp/<random>/results/growbench.sqlite``: a committed file then differed from
    machine to machine. Now the database is named by its file name, whatever folder it was in."""
    _fake_recommendation(monkeypatch, "gram/solve/rsvd+metric/fast:newton")
    texts = []
    for folder in ("machine-a/results", "elsewhere/deep/b"):
        (tmp_path / folder).mkdir(parents=True)
        target = tmp_path / folder / "default.json"
        assert cli_main(["recommend", "--db", str(tmp_path / folder / "growbench.sqlite"), "--write",
                         "--default-file", str(target)]) == 0
        data = json.loads(target.read_text())
        assert data["db"] == data["regimes"]["cpu/small"]["db"] == "growbench.sqlite"
        assert str(tmp_path) not in target.read_text()
        # A kept entry written before, naming its database by an absolute path, is named by the file name too.
        old = {"cuda/medium": {"spec": "formula1", "db": "/tmp/x1/results/gpu.sqlite"},
               "cuda/large": PLUGIN_ENTRY | {"db": "/tmp/x1/p.sqlite"}}
        target.write_text(json.dumps({"regimes": old}))
        assert cli_main(["recommend", "--db", str(tmp_path / folder / "growbench.sqlite"), "--write",
                         "--default-file", str(target)]) == 0
        data = json.loads(target.read_text())
        assert data["regimes"]["cuda/medium"] == {"spec": "formula1", "db": "gpu.sqlite"}
        assert data["regimes"]["cuda/large"] == PLUGIN_ENTRY | {"db": "/tmp/x1/p.sqlite"}  # unreadable: as it was
        data["regimes"].pop("cuda/medium")
        data["regimes"].pop("cuda/large")
        for key in ("generated",):
            data.pop(key)
            data["regimes"]["cpu/small"].pop(key)
        texts.append(data)
    assert texts[0] == texts[1]
