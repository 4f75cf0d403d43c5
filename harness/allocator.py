"""What this process's C allocator does with freed memory, for the processes that time growths.

torch takes CPU tensors from the C library's ``malloc``. glibc's hands a freed block larger than its mmap
threshold (128 KiB at start, raised as such blocks are freed, at most 32 MiB) back to the kernel at once, and
trims free memory off the top of its heap; the next tensor of that size is mapped afresh, and every one of its
pages faults on first touch. A growth and its loss calls make score-sized temporaries (``b·d_s²`` floats:
16 MiB at the reference size, 64 MiB in the scale set) by the dozen, so part of what was timed as "loss calls"
was the kernel zeroing pages: at d_e = 64 and 256 a loss call inside a growth took 1.5-2 times the same call
in the floor (docs/results.md, issue 37).

:func:`keep_freed_memory` asks glibc (``mallopt``) to serve every block from its heap and to keep what is
freed there, as jemalloc or tcmalloc do, the allocators PyTorch's CPU performance guide suggests
(``LD_PRELOAD``). The ``growbench`` command, its sweep workers and the asv suites call it first, so that the
floor and the growth are timed alike; :func:`release_freed_memory` hands the kept memory back, so that a CPU
peak-memory measure (``harness.memory``) starts from what is live. A process of your own calls it if it wants
the same. Nothing is changed where the user chose already: ``GROWBENCH_ALLOCATOR=system``, glibc's own
``MALLOC_*_`` variables, or an allocator in ``LD_PRELOAD``.

The price is memory. glibc reuses a freed block only once freed blocks lie side by side (torch's aligned
allocations ask a few bytes more than a freed block of the same size holds), after a burn-in of some blocks
per size, and it keeps what it held at the peak: on a loop of growths at d_e 64-256 the resident set settled
36 % above the system allocator's peak, and grew no further. torch's own ``THP_MEM_ALLOC_ENABLE`` (huge pages
for large tensors) cuts the faults too, but only if set before torch first allocates, and was slower in the
same comparison.
"""

from __future__ import annotations

import ctypes
import os
import platform

#: glibc's ``mallopt`` parameters (``<malloc.h>``).
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
#: Free memory at the top of the heap above which glibc would trim it: the largest the ``int`` parameter holds.
TRIM_THRESHOLD = 2**31 - 1
#: The variable that leaves the allocator as it is (``system``).
ENV = "GROWBENCH_ALLOCATOR"
#: glibc's own tuning variables: set, they are the user's choice.
_GLIBC_VARIABLES = ("MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                    "GLIBC_TUNABLES")
_KEPT = "glibc, freed memory kept (mallopt: no mmap, no trim)"
_state: list[str] = []  # the description once set: the setting is the process's, made once


def _libc() -> ctypes.CDLL | None:
    """The process's C library where it is glibc with ``mallopt`` and ``malloc_trim``, else None."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def _user_choice() -> str | None:
    """The allocator setting the user made, in words, or None where they made none."""
    if os.environ.get(ENV, "").strip().lower() == "system":
        return f"system ({ENV}=system)"
    preload = os.environ.get("LD_PRELOAD", "")
    if any(name in preload for name in ("jemalloc", "tcmalloc", "mimalloc")):
        return f"preloaded ({os.path.basename(preload.split()[0] if preload.split() else preload)})"
    tuned = [name for name in _GLIBC_VARIABLES if name in os.environ]
    if tuned:
        return f"glibc as tuned by {', '.join(tuned)}"
    return None


def keep_freed_memory() -> str:
    """Have glibc's ``malloc`` keep freed memory in this process instead of handing it back to the kernel.

    Serves every block from the heap (``M_MMAP_MAX = 0``) and never trims it below
    :data:`TRIM_THRESHOLD` of free memory, so a block freed by one loss call is reused by the next without
    page faults. For the life of the process, like any allocator setting; called again, it changes nothing.

    Returns
    -------
    str
        The allocator in force, in words, for the record: ``"glibc, freed memory kept (...)"``, or why it was
        left as it was (``GROWBENCH_ALLOCATOR=system``, glibc's ``MALLOC_*_`` variables, a preloaded allocator,
        a C library other than glibc).
    """
    if _state:
        return _state[0]
    choice = _user_choice()
    libc = None if choice else _libc()
    if choice:
        described = choice
    elif libc is None:
        described = "system (not glibc)"
    elif libc.mallopt(_M_MMAP_MAX, 0) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1:
        described = _KEPT
    else:  # glibc refused a parameter (none of its versions does): say so rather than claim the setting
        described = "glibc (mallopt refused; defaults)"
    _state.append(described)
    return described


def allocator() -> str:
    """The allocator setting of this process in words: :func:`keep_freed_memory`'s, or ``"system"``."""
    return _state[0] if _state else "system"


def release_freed_memory() -> None:
    """Hand the free memory glibc kept back to the kernel (``malloc_trim(0)``); nothing elsewhere.

    A CPU peak-memory measure reads the resident set's growth: from memory already resident, a block reused
    would not show.
    """
    if _state and _state[0] == _KEPT:
        libc = _libc()
        if libc is not None:
            libc.malloc_trim(0)
