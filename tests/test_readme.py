"""The README's Python blocks run as written (each in a fresh interpreter: one registers a component)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)


def test_the_readme_has_python_blocks():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_every_python_block_of_the_readme_runs(block, tmp_path):
    done = subprocess.run([sys.executable, "-c", block], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


#: Pastes a block line by line into Python's interactive console (what `python` does with a paste): a blank line
#: ends a compound statement there, and a statement right after one without a blank line is a syntax error.
PASTE = """
import code, sys
console = code.InteractiveConsole()
errors = []
console.write = errors.append
more = False
for line in sys.stdin.read().splitlines():
    more = console.push(line)
if more:
    console.push("")
sys.stdout.write("".join(errors))
sys.exit(1 if errors else 0)
"""


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_every_python_block_pastes_into_the_interactive_interpreter(block):
    done = subprocess.run([sys.executable, "-c", PASTE], input=block, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_the_paste_check_fails_on_what_the_interpreter_refuses():
    for bad in ("for i in range(2):\n    x = i\ny = 1\n", "class A:\n    a = 1\n\n    b = 2\n"):
        assert subprocess.run([sys.executable, "-c", PASTE], input=bad, capture_output=True, text=True,
                              timeout=60).returncode == 1


README = (ROOT / "README.md").read_text()


def test_the_readme_counts_are_the_codes():
    """Every count the README states about the code is the code's own: specs, the smoke sweep's runs, the seeds of
    the quick sweep and of the real training."""
    from growbench import strategies
    from growbench.harness.runner.sweep import PRETRAINED_SEEDS, RULE_SEEDS, expand, sweep_presets
    from growbench.harness.runner.train_sweep import train_presets

    assert int(re.search(r"all (\d+) specs", README).group(1)) == len(strategies.specs())
    assert int(re.search(r"--preset smoke +# (\d+) runs", README).group(1)) == len(expand(sweep_presets()["smoke"]))
    quick = re.search(r"--preset quick +# .*?\((\d+) seeds\).*?\((\d+) seeds\)", README)
    assert (int(quick.group(1)), int(quick.group(2))) == (len(RULE_SEEDS), len(PRETRAINED_SEEDS))
    real_seeds = int(re.search(r"train --preset real +# .*?(\d+) seeds", README).group(1))
    assert real_seeds == len({c.seed for c in train_presets()["real"]})
    quick_seeds = int(re.search(r"train --preset quick +# .*?(\d+) seeds", README).group(1))
    assert quick_seeds == len({c.seed for c in train_presets()["quick"]})
