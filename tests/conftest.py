"""Shared helpers of the ``strategies`` tests: seeded inputs and independent float64 references.

Everything here is written with plain torch / numpy loops so that it can serve as an
oracle for the library: nothing imports from ``strategies`` except what is under test.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import numpy as np
import pytest
import torch

DT = torch.float64

# Every matrix here is tiny: threads only add overhead (on this 2-core machine a multi-threaded
# LAPACK QR of a 6×6 matrix takes ~8 ms instead of ~10 µs, which made rsvd tests 100× slower).
torch.set_num_threads(1)

#: The most workers ``-n auto`` starts: each holds torch and its own models (about half a GiB), and with whole files
#: per worker the longest file bounds the suite long before a fifth worker would help.
MAX_WORKERS = 4


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: known only where xdist is installed
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker per core this process may use, at most :data:`MAX_WORKERS`."""
    return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                      else os.cpu_count() or 1))


def gen(seed: int) -> torch.Generator:
    """A fresh CPU generator: every random draw in the tests goes through one."""
    return torch.Generator().manual_seed(seed)


def covariance(d: int, cond: float, seed: int) -> torch.Tensor:
    """Random SPD ``(d, d)`` matrix with eigenvalues geometric from 1 to ``1/cond``."""
    Q, _ = torch.linalg.qr(torch.randn(d, d, generator=gen(seed), dtype=DT))
    w = torch.logspace(0, -math.log10(cond), d, dtype=DT)
    return (Q * w) @ Q.T


def anisotropic_X(b: int, d_s: int, d_e: int, cond: float = 1e3, seed: int = 0) -> torch.Tensor:
    """``X ~ N(0, Σ)``, ``Σ`` of condition number ``cond``, shape ``(b, d_s, d_e)``."""
    L = torch.linalg.cholesky(covariance(d_e, cond, seed))
    return torch.randn(b, d_s, d_e, generator=gen(seed + 10_000), dtype=DT) @ L.T


def repeated_tokens_X(b: int, d_s: int, d_e: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """Sequences of tokens drawn from ``vocab`` embeddings: identical rows, rank ``≤ vocab``."""
    g = gen(seed)
    E = torch.randn(vocab, d_e, generator=g, dtype=DT)
    idx = torch.randint(0, vocab, (b, d_s), generator=g)
    idx[:, 0] = 0  # the first two positions repeat the same token in every sequence
    idx[:, 1] = 0
    return E[idx]


def random_G(b: int, d_s: int, seed: int = 0, mask: torch.Tensor | None = None) -> torch.Tensor:
    G = torch.randn(b, d_s, d_s, generator=gen(seed), dtype=DT)
    return G if mask is None else G * mask


def factors(d_e: int, d_k: int, seed: int = 0, std: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
    g = gen(seed)
    return (torch.randn(d_e, d_k, generator=g, dtype=DT) * std, torch.randn(d_e, d_k, generator=g, dtype=DT) * std)


def causal(d_s: int) -> torch.Tensor:
    return torch.ones(d_s, d_s, dtype=torch.bool).tril()


def attention_loss(b: int, d_s: int, d_v: int = 3, seed: int = 0, mask: torch.Tensor | None = None) -> Callable:
    """A smooth nonlinear loss of the scores: softmax attention over fixed values, MSE to a target."""
    g = gen(seed)
    V = torch.randn(b, d_s, d_v, generator=g, dtype=DT)
    T = torch.randn(b, d_s, d_v, generator=g, dtype=DT)

    def loss(S: torch.Tensor) -> torch.Tensor:
        if mask is not None:
            S = S.masked_fill(~mask, float("-inf"))
        return ((torch.softmax(S, dim=-1) @ V - T) ** 2).mean()

    return loss


def grad_of(loss: Callable, S: torch.Tensor) -> torch.Tensor:
    """``∂ loss / ∂S`` by autograd."""
    S = S.detach().clone().requires_grad_(True)
    (G,) = torch.autograd.grad(loss(S), S)
    return G


class Counted:
    """Wraps a loss closure and counts how often it is called."""

    def __init__(self, fn: Callable) -> None:
        self.fn = fn
        self.calls = 0

    def __call__(self, S: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.fn(S)


def scores(X: torch.Tensor, Z: torch.Tensor) -> torch.Tensor:
    """``X_b Z X_bᵀ`` by an explicit loop over samples."""
    return torch.stack([x @ Z @ x.T for x in X])


# ---------------------------------------------------------------- numpy oracles
def np64(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float64).numpy()


def mask_array(mask: torch.Tensor | None, b: int, d_s: int) -> np.ndarray:
    """The mask as a float ``(b, d_s, d_s)`` array of zeros and ones."""
    if mask is None:
        return np.ones((b, d_s, d_s))
    return np.broadcast_to(mask.numpy().astype(np.float64), (b, d_s, d_s)).copy()


def kron_design(X: torch.Tensor, mask: torch.Tensor | None = None) -> np.ndarray:
    """The map ``vec(P) ↦ (vec(mask_b ⊙ X_b P X_bᵀ))_b`` as a dense ``(b·d_s², d_e²)`` matrix.

    Row-major ``vec``: ``(X P Xᵀ)_{ij} = Σ_kl X_ik X_jl P_kl = (X ⊗ X)[i d_s + j, k d_e + l]``.
    """
    Xn = np64(X)
    b, d_s, _ = Xn.shape
    m = mask_array(mask, b, d_s)
    return np.concatenate([np.kron(Xn[i], Xn[i]) * m[i].reshape(-1, 1) for i in range(b)])


def kron_normal(X: torch.Tensor, G: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Dense normal equations ``(K, rhs)`` of the joint problem, averaged over samples.

    Without a mask ``K = mean_b A_b ⊗ A_b``; with one ``K = mean_b (X_b⊗X_b)ᵀ diag(vec mask_b) (X_b⊗X_b)``.
    ``rhs = mean_b vec(X_bᵀ (mask_b ⊙ G_b) X_b)``.
    """
    Xn, Gn = np64(X), np64(G)
    b, d_s, d_e = Xn.shape
    m = mask_array(mask, b, d_s)
    K = np.zeros((d_e * d_e, d_e * d_e))
    rhs = np.zeros(d_e * d_e)
    for i in range(b):
        if mask is None:
            A = Xn[i].T @ Xn[i]
            K += np.kron(A, A)
        else:
            Kb = np.kron(Xn[i], Xn[i])
            K += Kb.T @ (m[i].reshape(-1, 1) * Kb)
        rhs += (Xn[i].T @ (m[i] * Gn[i]) @ Xn[i]).reshape(-1)
    return K / b, rhs / b


def dense_joint(X: torch.Tensor, G: torch.Tensor, mask: torch.Tensor | None = None) -> np.ndarray:
    """Minimum-norm solution ``P (d_e, d_e)`` of the joint normal equations by a dense solve."""
    K, rhs = kron_normal(X, G, mask)
    d_e = X.shape[-1]
    return np.linalg.lstsq(K, rhs, rcond=None)[0].reshape(d_e, d_e)


def kron_projection(X: torch.Tensor, G: torch.Tensor, mask: torch.Tensor | None = None) -> np.ndarray:
    """``ΠG``: orthogonal projection of ``(mask ⊙ G_b)_b`` on the range of the design, ``(b, d_s, d_s)``."""
    D = kron_design(X, mask)
    b, d_s = G.shape[0], G.shape[1]
    g = (mask_array(mask, b, d_s) * np64(G)).reshape(-1)
    coef = np.linalg.lstsq(D, g, rcond=None)[0]
    return (D @ coef).reshape(b, d_s, d_s)


def masked_scores_np(X: torch.Tensor, P: np.ndarray, mask: torch.Tensor | None = None) -> np.ndarray:
    """``(mask_b ⊙ X_b P X_bᵀ)_b`` in numpy."""
    Xn = np64(X)
    b, d_s, _ = Xn.shape
    m = mask_array(mask, b, d_s)
    return np.stack([m[i] * (Xn[i] @ P @ Xn[i].T) for i in range(b)])


def rel_err(a, b) -> float:
    """``max|a − b| / max|b|`` (``max|a − b|`` when ``b`` is zero)."""
    a = np.asarray(a.detach().numpy() if torch.is_tensor(a) else a, dtype=np.float64)
    b = np.asarray(b.detach().numpy() if torch.is_tensor(b) else b, dtype=np.float64)
    scale = np.abs(b).max() if b.size else 0.0
    diff = np.abs(a - b).max() if a.size else 0.0
    return float(diff / scale) if scale > 0 else float(diff)
