"""Where each small factorisation of a growth is fastest on a GPU host: the device's solver against the host's
LAPACK (both transfers included), at the scale set's widths; and two hand-made randomised SVDs against
``torch.svd_lowrank`` (their cost and the top-8 subspace they find). Medians of synchronised wall times.

Run on a lease by ``run.sh``: ``python factorisations.py cuda [64,256,768,1024,4096]``. On a CPU it runs too
(``cpu``), where "device" and "host" are the same and only the script is checked.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import torch

SKETCH, POWER_ITERATIONS, TOP = 24, 4, 8  # the truncation's own sketch at rank 8 (oversample 16, 4 iterations)


def median_ms(fn: Callable[[], object], device: str, repeats: int = 7, warmup: int = 2) -> float:
    """Median wall time of ``fn`` in ms, the device synchronised around each call."""
    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def on_host(fn: Callable, *args: torch.Tensor) -> Callable[[], tuple]:
    """``fn`` on the host: its arguments brought there, its results taken back to their device."""
    device = args[0].device

    def run() -> tuple:
        out = fn(*(a.cpu() for a in args))
        return tuple(o.to(device) for o in (out if isinstance(out, tuple) else (out,)))
    return run


def chol_qr2(X: torch.Tensor) -> torch.Tensor:
    """An orthonormal basis of ``X (n, q)`` by Cholesky QR twice, with no host read (``cholesky_ex``)."""
    for _ in range(2):
        L, _ = torch.linalg.cholesky_ex(X.mT @ X)
        X = torch.linalg.solve_triangular(L, X.mT, upper=False).mT
    return X


def rsvd(A: torch.Tensor, orthonormal: Callable[[torch.Tensor], torch.Tensor],
         small_svd: Callable[[torch.Tensor], tuple]) -> torch.Tensor:
    """Halko's randomised SVD of ``A (n, n)`` (the sketch and power iterations of ``torch.svd_lowrank``) with the
    given orthonormalisation and SVD of the ``(q, n)`` sketch; the left singular vectors ``(n, q)``."""
    gen = torch.Generator(device=A.device).manual_seed(0)
    Q = orthonormal(A @ torch.randn(A.shape[1], SKETCH, device=A.device, dtype=A.dtype, generator=gen))
    for _ in range(POWER_ITERATIONS):
        Q = orthonormal(A @ orthonormal(A.mT @ Q))
    U, _, _ = small_svd(Q.mT @ A)
    return Q @ U.to(Q.device)


def host_qr(X: torch.Tensor) -> torch.Tensor:
    return torch.linalg.qr(X.cpu()).Q.to(X.device)


def host_svd(B: torch.Tensor) -> tuple:
    return torch.linalg.svd(B.cpu(), full_matrices=False)


def device_svd(B: torch.Tensor) -> tuple:
    return torch.linalg.svd(B, full_matrices=False)


def subspace_gap(U: torch.Tensor, U_ref: torch.Tensor) -> float:
    """``1 −`` the smallest cosine of the principal angles between the top-:data:`TOP` subspaces."""
    return float(1 - torch.linalg.svdvals(U[:, :TOP].double().mT @ U_ref[:, :TOP].double()).min())


def one_width(n: int, device: str) -> None:
    gen = torch.Generator().manual_seed(n)
    M = torch.randn(n, n, generator=gen, dtype=torch.float64)
    A64 = (M @ M.mT / n + 1e-3 * torch.eye(n, dtype=torch.float64)).to(device)  # a Gram matrix E[XᵀX]
    A32 = A64.float()
    # A whitened Z − λP̂: a spectrum decaying over three decades
    Y = (torch.randn(n, n, generator=gen) * torch.logspace(0, -3, n)).to(device)
    X = torch.randn(n, SKETCH, generator=gen).to(device)
    B = torch.randn(SKETCH, n, generator=gen).to(device)
    rows: list[tuple[str, Callable, Callable | None]] = [
        ("eigh float64", lambda: torch.linalg.eigh(A64), on_host(torch.linalg.eigh, A64)),
        ("eigh float32", lambda: torch.linalg.eigh(A32), on_host(torch.linalg.eigh, A32)),
        ("cholesky_ex float64", lambda: torch.linalg.cholesky_ex(A64), on_host(torch.linalg.cholesky_ex, A64)),
        (f"qr (n, {SKETCH}) float32", lambda: torch.linalg.qr(X), on_host(torch.linalg.qr, X)),
        (f"chol-qr2 (n, {SKETCH}) float32", lambda: chol_qr2(X), None),
        (f"svd ({SKETCH}, n) float32", lambda: device_svd(B), on_host(device_svd, B)),
        (f"svd_lowrank q={SKETCH} niter={POWER_ITERATIONS}",
         lambda: torch.svd_lowrank(Y, q=SKETCH, niter=POWER_ITERATIONS), None),
        ("rsvd chol-qr2 on device", lambda: rsvd(Y, chol_qr2, device_svd), None),
        ("rsvd, QR and small SVD on host", lambda: rsvd(Y, host_qr, host_svd), None),
    ]
    if n <= 1024:
        rows.append(("svd full float32", lambda: device_svd(Y), on_host(device_svd, Y)))
        if device == "cuda":
            rows.append(("svd full float32 gesvdj",
                         lambda: torch.linalg.svd(Y, full_matrices=False, driver="gesvdj"), None))
    for name, on_device, host in rows:
        t_device = median_ms(on_device, device)
        # At 4096 the host's LAPACK takes seconds a call: once, and only for the float64 eigh
        if host is None or (n >= 4096 and name != "eigh float64"):
            t_host = float("nan")
        else:
            t_host = median_ms(host, device, repeats=1 if n >= 4096 else 5, warmup=0 if n >= 4096 else 1)
        print(f"| {n} | {name} | {t_device:.3f} | {t_host:.3f} |", flush=True)
    if n > 1024:
        return
    U_ref = torch.linalg.svd(Y.double(), full_matrices=False)[0]
    found = {"svd_lowrank": torch.svd_lowrank(Y, q=SKETCH, niter=POWER_ITERATIONS)[0],
             "rsvd chol-qr2": rsvd(Y, chol_qr2, device_svd), "rsvd host small": rsvd(Y, host_qr, host_svd)}
    for name, U in found.items():
        print(f"  n={n} {name}: top-{TOP} subspace 1-cos = {subspace_gap(U, U_ref):.2e}", flush=True)


def main(argv: list[str]) -> None:
    device = argv[0] if argv else "cuda"
    widths = [int(w) for w in argv[1].split(",")] if len(argv) > 1 else [64, 256, 768, 1024, 4096]
    torch.set_num_threads(8)
    where = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(f"torch {torch.__version__}, {where}, host threads {torch.get_num_threads()}", flush=True)
    one = torch.zeros((), device=device)
    print(f"host read (0-dim .item()): {median_ms(lambda: one.add(1).item(), device, repeats=50):.4f} ms", flush=True)
    print("| n | op | device ms | host ms (transfers incl.) |\n|---|---|---|---|", flush=True)
    for n in widths:
        one_width(n, device)


if __name__ == "__main__":
    main(sys.argv[1:])
