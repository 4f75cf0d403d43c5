"""harness.allocator: freed memory kept by glibc, measured by the kernel's own count of page faults.

Each case runs in a fresh interpreter: the setting is the process's for its life, and this one's is not ours.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="mallopt is glibc's; elsewhere the allocator is left as it is")

#: 64 MiB of float32: above glibc's largest mmap threshold, so glibc's defaults map it afresh every time.
_FAULTS = """
import json, resource, torch
from growbench.harness.allocator import allocator, keep_freed_memory
if {keep}:
    keep_freed_memory()
def faults_of_one_block():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = torch.empty(16 * 2**20).fill_(1.0)  # every page touched
    del t
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
# glibc places the next block past the last one until freed blocks lie side by side and merge (torch's aligned
# allocations ask a few bytes more than a freed block of the same size holds): a burn-in, then the steady state.
rounds = [faults_of_one_block() for _ in range(24)]
print(json.dumps({{"faults": max(rounds[-8:]), "allocator": allocator()}}))
"""

#: A CPU peak-memory measure still sees a block the allocator reuses from memory it kept.
_PEAK = """
import json, torch
from growbench.harness.allocator import keep_freed_memory
from growbench.harness.memory import peak_memory
keep_freed_memory()
torch.empty(16 * 2**20).fill_(1.0)  # 64 MiB freed at once, kept by the allocator
with peak_memory("cpu") as mem:
    t = torch.empty(16 * 2**20).fill_(1.0)
print(json.dumps({"peak": mem["peak_bytes"]}))
"""

PAGES = 64 * 2**20 // os.sysconf("SC_PAGE_SIZE")


def _run(code: str, **env: str) -> dict:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GROWBENCH_ALLOCATOR"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**environ, **env})
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_kept_memory_serves_the_next_block_without_page_faults():
    kept = _run(_FAULTS.format(keep=True))
    system = _run(_FAULTS.format(keep=False))
    assert kept["allocator"].startswith("glibc, freed memory kept")
    assert system["allocator"] == "system"
    # glibc's defaults map the block afresh: a fault for (nearly) every page, every time; kept, once the burn-in is
    # over, the block is reused as it is.
    assert system["faults"] > PAGES // 2
    assert kept["faults"] < PAGES // 100


@pytest.mark.parametrize("env, says", [
    ({"GROWBENCH_ALLOCATOR": "system"}, "system (GROWBENCH_ALLOCATOR=system)"),
    ({"MALLOC_TRIM_THRESHOLD_": "131072"}, "glibc as tuned by MALLOC_TRIM_THRESHOLD_"),
])
def test_a_choice_the_user_made_is_left_as_it_is(env, says):
    r = _run(_FAULTS.format(keep=True), **env)
    assert r["allocator"] == says
    assert r["faults"] > PAGES // 2  # glibc's behaviour, not ours


def test_the_cpu_peak_memory_sees_a_block_reused_from_kept_memory():
    assert _run(_PEAK)["peak"] >= 60 * 2**20
