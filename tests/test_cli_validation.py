"""Every configuration is checked before any work: one line on stderr naming the option, exit 2, no row.

Covers issue 12's invalid inputs at the command line (``run``, ``train``, ``example``,
``recommend``, ``targets``) and through the sweep API, and the command line's small
defects: a closed pipe, issue numbers in help texts, the interrupt hint, the rank gap.
"""

from __future__ import annotations

import math
import re
import subprocess

import pandas as pd
import pytest
import torch
from helpers import GROWBENCH, ROOT

from growbench.harness import validate
from growbench.harness.cli import build_parser
from growbench.harness.cli import main as cli_main
from growbench.harness.measure import RunConfig
from growbench.harness.validate import ConfigError

TINY = ["--strategies", "formula2", "--datasets", "teacher", "--d-s", "8", "--d-e", "8", "--b", "4", "--d-k", "2",
        "--p", "2", "--warmup-steps", "2", "--repeats", "1", "--n-batches", "1", "--no-progress"]
HUGE_B = str(10**9)  # far beyond any machine's memory at any d_s, d_e


def refused(capsys, tmp_path, argv: list[str], option: str) -> str:
    """Run the CLI in-process and check the refusal: exit 2, one stderr line naming ``option``, no database."""
    db = tmp_path / "r.sqlite"
    if argv[0] in ("run", "train", "recommend"):
        argv = [*argv, "--db", str(db)]
    if argv[0] in ("run", "targets"):
        argv = [*argv, "--cache-dir", str(tmp_path / "cache")]
    with pytest.raises(SystemExit) as info:  # argparse's refusals exit; ours return
        raise SystemExit(cli_main(argv))
    assert info.value.code == 2, argv
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert option in lines[0], (option, lines[0])
    assert "Traceback" not in err
    assert not db.exists(), "a refused command must not create or write the database"
    assert not (tmp_path / "cache").exists(), "a refused command must not train or cache a model"
    return lines[0]


# ------------------------------------------------------------------ growbench run
RUN_CASES = [
    (["--d-k", "6", "--p", "4"], "--d-k/--p"),  # d_k + p = 10 > d_e = 8
    (["--d-e", "0"], "--d-e"),
    (["--d-e", "-8"], "--d-e"),
    (["--b", "0"], "--b"),
    (["--b", "-3"], "--b"),
    (["--d-s", "0"], "--d-s"),
    (["--d-k", "0"], "--d-k"),
    (["--d-k", "-1"], "--d-k"),
    (["--p", "-2"], "--p"),
    (["--p", "0"], "--p"),
    (["--seeds", "-1"], "--seeds"),
    (["--warmup-steps", "-5"], "--warmup-steps"),
    (["--n-batches", "0"], "--n-batches"),
    (["--repeats", "0"], "--repeats"),
    (["--jobs", "0"], "--jobs"),
    (["--jobs", "-2"], "--jobs"),
    (["--threads", "0"], "--threads"),
    (["--max-memory", "0"], "--max-memory"),
    (["--max-memory", "nan"], "--max-memory"),
    (["--devices", "tpu"], "--devices"),
    (["--devices", "cpu,cuda:x"], "--devices"),
    (["--d-e", "100000"], "--d-e"),  # an 80 GB covariance before: refused by the memory estimate
    (["--b", HUGE_B], "--b"),
    (["--b", "64", "--max-memory", "0.000001"], "--max-memory"),
    (["--strategies", ""], "--strategies"),
    (["--strategies", ","], "--strategies"),
    (["--datasets", ""], "--datasets"),
    (["--strategies", "fomula1"], "--strategies"),
    (["--datasets", "nosuch"], "--datasets"),
    (["--datasets", "teacher:cond=-1"], "--datasets"),  # an option's value, checked by the dataset itself
    (["--datasets", "teacher:nosuch=1"], "--datasets"),
    (["--datasets", "teacher:cond"], "--datasets"),
    (["--datasets", "digits", "--d-s", "5"], "--datasets"),  # digits has patch sizes 4, 16, 64
    (["--datasets", "minilm-recovery"], "--datasets"),  # d_e must be 384: refused without loading the model
    (["--d-e", "8,x"], "--d-e"),
]


@pytest.mark.parametrize(("extra", "option"), RUN_CASES, ids=[" ".join(c[0]) or "empty" for c in RUN_CASES])
def test_run_refuses_invalid_input_in_one_line(extra, option, capsys, tmp_path):
    refused(capsys, tmp_path, ["run", *TINY, *extra], option)


def test_run_memory_refusal_shows_the_estimate(capsys, tmp_path):
    line = refused(capsys, tmp_path, ["run", *TINY, "--b", HUGE_B], "--b")
    assert re.search(r"needs an estimated [\d.]+ (GiB|TiB)", line) and "limit" in line, line


def test_run_refuses_cuda_when_absent(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    line = refused(capsys, tmp_path, ["run", *TINY, "--devices", "cpu,cuda"], "--devices")
    assert "torch.cuda.is_available() is False" in line


@pytest.mark.parametrize("weights", [True, False])
def test_a_preset_with_cuda_runs_is_refused_when_no_run_can_run_here(capsys, tmp_path, monkeypatch, weights):
    from growbench.datasets import minilm

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    # Without the real extra the MiniLM runs are left out, but only once the rest passed: still one line.
    monkeypatch.setattr(minilm, "weights_available", lambda: weights)
    refused(capsys, tmp_path, ["run", "--preset", "gpu", "--no-progress"], "--devices")


def test_the_limit_itself_is_accepted_and_the_run_written(tmp_path, capsys):
    """d_k + p = d_e is valid: checks must not refuse the edge."""
    db = tmp_path / "r.sqlite"
    assert cli_main(["run", *TINY, "--d-k", "6", "--p", "2", "--db", str(db),
                     "--cache-dir", str(tmp_path / "c")]) == 0
    capsys.readouterr()
    from growbench.harness.store.results import ResultsDB

    with ResultsDB(db) as d:
        frame = d.frame()
    assert list(frame.status) == ["ok"] and int(frame.d_k.iloc[0]) + int(frame.p.iloc[0]) == 8


# ------------------------------------------------------------------ growbench train
TRAIN_CASES = [
    (["--datasets", "nosuch"], "--datasets"),
    (["--datasets", ""], "--datasets"),
    (["--datasets", "teacher:cond=0"], "--datasets"),
    (["--methods", "nope"], "--methods"),
    (["--methods", ""], "--methods"),
    (["--seeds", "-1"], "--seeds"),
    (["--device", "tpu"], "--device"),
    (["--jobs", "0"], "--jobs"),
    (["--threads", "0"], "--threads"),
    (["--max-memory", "-1"], "--max-memory"),
    (["--max-memory", "0.000001"], "--preset"),  # the sizes come from the preset
    (["--preset", "nope"], "--preset"),
    (["--resume", "--no-resume"], "--no-resume"),
]


@pytest.mark.parametrize(("extra", "option"), TRAIN_CASES, ids=[" ".join(c[0]) or "empty" for c in TRAIN_CASES])
def test_train_refuses_invalid_input_in_one_line(extra, option, capsys, tmp_path):
    argv = ["train", "--no-progress", *extra]
    if "--preset" not in extra:
        argv += ["--preset", "smoke"]
    refused(capsys, tmp_path, argv, option)


def test_train_refuses_cuda_when_absent(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    refused(capsys, tmp_path, ["train", "--preset", "smoke", "--device", "cuda", "--no-progress"], "--device")


def test_train_nosuch_dataset_subprocess_exits_2_with_a_message(tmp_path):
    """The issue's exact command, as a user runs it (not in-process)."""
    db = tmp_path / "t.sqlite"
    proc = subprocess.run([*GROWBENCH, "train", "--preset", "smoke", "--datasets", "nosuch",
                           "--db", str(db)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--datasets" in lines[0] and "nosuch" in lines[0], proc.stderr
    assert not db.exists()


def test_train_accepts_resume_which_its_interrupt_message_names(tmp_path, capsys, monkeypatch):
    """The interrupt hint of ``train`` names only options ``train`` accepts."""
    import growbench.harness.runner.train_sweep as ts

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ts, "run_train_sweep", interrupted)
    base = ["train", "--preset", "smoke", "--no-progress", "--db", str(tmp_path / "t.sqlite")]
    assert cli_main(base) == 130
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the "12 training runs -> ..." line
    assert err.startswith("growbench: interrupted")
    named = re.findall(r"--[a-z][a-z-]*", err)
    assert named, err
    for option in named:  # each option the hint names parses for train
        build_parser().parse_args(["train", option])
    assert build_parser().parse_args(["train", "--resume"]).no_resume is False


# ------------------------------------------------------------------ example, recommend, targets
EXAMPLE_CASES = [
    (["--cond", "-1"], "--cond"),
    (["--cond", "nan"], "--cond"),
    (["--cond", "inf"], "--cond"),
    (["--cond", "0.5"], "--cond"),
    (["--d-k", "60", "--p", "8"], "--d-k/--p"),
    (["--d-e", "0"], "--d-e"),
    (["--b", "-1"], "--b"),
    (["--repeats", "0"], "--repeats"),
    (["--device", "tpu"], "--device"),
    (["--b", HUGE_B], "--b"),
    (["--threads", "0"], "--threads"),
    (["--presets", "nope"], "--presets"),
]


@pytest.mark.parametrize(("extra", "option"), EXAMPLE_CASES, ids=[" ".join(c[0]) for c in EXAMPLE_CASES])
def test_example_refuses_invalid_input_in_one_line(extra, option, capsys, tmp_path):
    refused(capsys, tmp_path, ["example", *extra], option)


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "-inf", "x"])
def test_recommend_refuses_a_bad_tolerance(value, capsys, tmp_path):
    refused(capsys, tmp_path, ["recommend", "--tolerance", value], "--tolerance")


@pytest.mark.parametrize(("extra", "option"), [(["--device", "tpu"], "--device"), (["--repeats", "0"], "--repeats"),
                                               (["--threads", "0"], "--threads")])
def test_targets_refuses_invalid_input_in_one_line(extra, option, capsys, tmp_path):
    refused(capsys, tmp_path, ["targets", *extra], option)


# ------------------------------------------------------------------ the API: sweep and training
def test_run_config_refuses_what_cannot_run():
    RunConfig("formula2", "teacher", 8, 8, 4, 6, 2)  # d_k + p = d_e: fine
    for kw, field in ((dict(p=3), "d_k+p"), (dict(d_e=0), "d_e"), (dict(b=-1), "b"), (dict(repeats=0), "repeats"),
                      (dict(n_batches=0), "n_batches"), (dict(warmup_steps=-1), "warmup_steps"),
                      (dict(device="tpu"), "device"), (dict(dataset="nosuch"), "dataset"),
                      (dict(strategy="nope"), "strategy"), (dict(d_s=2.5), "d_s"), (dict(dtype="int64"), "dtype"),
                      (dict(scale_policy="x"), "scale_policy")):
        args = dict(strategy="formula2", dataset="teacher", d_s=8, d_e=8, b=4, d_k=6, p=2) | kw
        with pytest.raises(ConfigError) as info:
            RunConfig(**args)
        assert info.value.field == field, (kw, info.value.field)


def test_pretrained_sizes_are_checked_without_loading_the_model(monkeypatch):
    import growbench.datasets.minilm as minilm

    def no_load(*args, **kwargs):
        raise AssertionError("the model must not be loaded to check sizes")

    monkeypatch.setattr(minilm, "load_encoder", no_load)
    monkeypatch.setattr(minilm, "token_stream", no_load)
    monkeypatch.setattr(minilm, "_tokens", no_load)  # what a dataset tokenises its corpus with
    monkeypatch.setattr(minilm, "weights_available", lambda: True)  # sizes only: CI has no weights
    # The head's input has a ones column: d_k + p may reach d_e + 1 = 385.
    ok = RunConfig("formula2", "minilm-recovery:layer=1:head=3", 16, 384, 2, 380, 5)
    validate.check_runs([ok])
    with pytest.raises(ConfigError, match="385"):
        RunConfig("formula2", "minilm-recovery", 16, 384, 2, 380, 6)
    for d_e, d_s in ((32, 16), (384, 2), (384, 600)):
        with pytest.raises(ConfigError) as info:
            validate.check_runs([RunConfig("formula2", "minilm-similarity", d_s, d_e, 2, 2, 2)])
        assert info.value.field == "dataset"


def test_sweep_api_refuses_before_any_work(tmp_path):
    from growbench.harness.runner.sweep import expand, run_sweep

    grid = dict(strategies=["formula2"], datasets=["teacher"], d_s=[8], d_e=[8], b=[4], d_k=[2], p=[2], seeds=[0],
                devices=["cpu"], n_batches=1, repeats=1, warmup_steps=2)
    db = tmp_path / "r.sqlite"
    with pytest.raises(ConfigError, match=r"d_k \+ p"):
        expand([{**grid, "p": [2, 8]}])
    for axis in ("strategies", "datasets", "d_e", "seeds", "devices"):
        with pytest.raises(ConfigError, match="empty"):
            expand([{**grid, axis: []}])
    configs = expand([grid])
    for kw, field in ((dict(jobs=0), "jobs"), (dict(threads=0), "threads"), (dict(max_memory=1e-9), "memory")):
        with pytest.raises(ConfigError) as info:
            run_sweep(configs, str(db), cache_dir=str(tmp_path / "c"), progress=False, **kw)
        assert info.value.field == field
    assert not db.exists() and not (tmp_path / "c").exists()


def test_sweep_api_skips_absent_cuda_runs_of_a_mixed_grid_but_refuses_them_when_strict(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cpu = RunConfig("formula2", "teacher", 8, 8, 4, 2, 2)
    cuda = RunConfig("formula2", "teacher", 8, 8, 4, 2, 2, device="cuda")
    validate.check_runs([cpu, cuda], strict_devices=False)  # pending() skips the cuda run with a message
    for configs, strict in (([cpu, cuda], True), ([cuda], False)):
        with pytest.raises(ConfigError, match="is_available") as info:
            validate.check_runs(configs, strict_devices=strict)
        assert info.value.field == "device"


def test_train_api_refuses_before_any_work(tmp_path):
    from growbench.harness.runner.train_sweep import run_train_sweep
    from growbench.harness.train import TrainConfig

    tiny = dict(d_s=8, d_e=8, b=8, d_k0=2, d_k_max=4, p=2, grow_every=10, steps=20, eval_every=10)
    db = tmp_path / "t.sqlite"
    for kw, field in ((dict(dataset="nope"), "dataset"), (dict(dataset="digits", d_s=5), "dataset"),
                      (dict(dataset="teacher", b=0), "b"), (dict(dataset="teacher", seed=-1), "seed"),
                      (dict(dataset="teacher", device="tpu"), "device")):
        cfg = TrainConfig(method="default", **{**tiny, **kw})
        with pytest.raises(ConfigError) as info:
            run_train_sweep([cfg], str(db), progress=False)
        assert info.value.field == field, kw
    good = TrainConfig(method="default", dataset="teacher", **tiny)
    with pytest.raises(ConfigError):
        run_train_sweep([good], str(db), progress=False, jobs=0)
    assert not db.exists()


def test_memory_estimate_grows_with_every_size_and_the_limit_is_honoured():
    base = dict(b=64, d_s=32, d_in=32, n_batches=4)
    ref = validate.estimate_bytes(**base)
    for key in base:
        assert validate.estimate_bytes(**{**base, key: 2 * base[key]}) > ref, key
    assert validate.estimate_bytes(**base, dtype="float64") > ref
    validate.check_memory(ref, "cpu", "x", max_memory=ref / validate.GIB * 1.01)
    with pytest.raises(ConfigError, match="GiB"):
        validate.check_memory(ref, "cpu", "x", jobs=2, max_memory=ref / validate.GIB * 1.5)


def test_recommend_api_refuses_a_bad_tolerance():
    from growbench.harness.recommend import recommend

    frame = pd.DataFrame({"status": ["ok"]})
    for bad in (-0.1, math.nan, math.inf, "0.1", True):
        with pytest.raises(ValueError, match="tolerance"):
            recommend(frame, tolerance=bad)


# ------------------------------------------------------------------ small defects
def test_a_closed_pipe_ends_quietly():
    """``growbench list --json | head``: the reader goes away; no BrokenPipeError traceback."""
    proc = subprocess.Popen([*GROWBENCH, "list", "--json"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before the child writes a byte: every write hits a pipe without a reader
    err = proc.stderr.read().decode()
    proc.wait(timeout=300)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert proc.returncode == 141  # 128 + SIGPIPE, as a writer killed by the signal


@pytest.mark.parametrize("command", ["list", "run", "train", "export", "targets", "example", "report", "recommend"])
def test_help_texts_name_no_issue_numbers(command, capsys):
    with pytest.raises(SystemExit):
        cli_main([command, "--help"])
    out = capsys.readouterr().out
    assert not re.search(r"issue\s*#?\d", out, re.IGNORECASE), out


def test_plural_wording():
    from growbench.harness.report.wording import plural

    assert plural(1, "seed") == "1 seed" and plural(3, "seed") == "3 seeds" and plural(0, "point") == "0 points"


def test_runners_up_say_why_a_rank_is_missing():
    from growbench.harness.recommend import Recommendation, format_text, rank_note

    table = pd.DataFrame({"strategy": ["a/fast", "b/chosen", "c/slow"], "preset": ["", "", ""],
                          "time_ms": [1.0, 2.0, 3.0], "x_floor": [1.0, 2.0, 3.0], "eligible": [False, True, True],
                          "qualifies": [False, True, True], "worst_shortfall": [0.5, 0.0, 0.0],
                          "reason": ["failed 1 of 2 runs", "chosen", "qualifies but slower"], "rank": [1, 2, 3]})
    rec = Recommendation(spec="b/chosen", rule="rule", fallback=False, tolerance=0.02, datasets=[], cells={},
                         evidence={"median_time_ms": 2.0, "median_x_floor": 2.0}, table=table)
    note = rank_note(rec)
    assert "rank 2" in note and "b/chosen" in note
    text = format_text(rec)
    listed = [int(m) for m in re.findall(r"^\s+(\d+)\. ", text, re.MULTILINE)]
    assert listed == [1, 3]
    assert note in text  # the gap is explained where it appears
