"""Memory of the statistics (docs/mathematics.md §3): streaming formulas keep ``O(d_e²)``, joint keeps every ``X_b``.

asv's ``peakmem_*`` is the process's peak resident set size, setup included (the
torch import, ~270 MB, is the floor). Updating the same statistics with 10 batches
instead of 1 must leave it flat for every formula but ``joint`` (+8 MB per batch of
the reference size). glibc's mmap threshold is fixed in setup
(``common.fix_malloc_threshold``): otherwise freed batches stay resident in its heap
and the peak grows with the batch count even where the live memory does not.
``track_retained_bytes`` is the deterministic counterpart: bytes of the tensors the
statistics object holds after the updates.
"""

from . import common


def _batches(n, b, seed=common.SEED):
    """``n`` fresh batches ``(X, G)``, made one at a time so that only one is alive."""
    torch = common.init_torch()
    gen = torch.Generator().manual_seed(seed)
    L = torch.linalg.cholesky(common.anisotropic_covariance(common.D_E, common.COND, gen)).float()
    for _ in range(n):
        X = torch.randn(b, common.D_S, common.D_E, generator=gen) @ L.mT
        G = torch.randn(b, common.D_S, common.D_S, generator=gen) / common.D_S
        yield X, G


class MemStatisticsStreaming:
    """One statistics object updated with ``n_batches`` batches of the reference size."""

    params = (common.STAT_KINDS, [1, 10])
    param_names = ["statistics", "n_batches"]
    timeout = 120
    rounds = 1

    def setup(self, kind, n_batches):
        common.init_torch()
        common.fix_malloc_threshold()
        self.s = common.make(common.spec_of(kind))
        # Statistics' first use (lazy torch kernels, LAPACK workspaces) before the measurement.
        small = self.s.new_statistics()
        for X, G in _batches(1, 4, seed=1):
            small.update(X, G)

    def _run(self, n_batches):
        stats = self.s.new_statistics()
        for X, G in _batches(n_batches, common.B):
            stats.update(X, G)
            del X, G
        return stats

    def peakmem_update(self, kind, n_batches):
        self._run(n_batches)

    def track_retained_bytes(self, kind, n_batches):
        return common.retained_bytes(self._run(n_batches))

    track_retained_bytes.unit = "bytes"


class MemPerSample:
    """Formula 1's per-sample ``X_b^† G_b X_b^†ᵀ`` over one batch: pinv (batched SVD) vs solve (Cholesky)."""

    params = (common.INVERSES, [64, 256])
    param_names = ["inverse", "b"]
    timeout = 120
    rounds = 1

    def setup(self, inv, b):
        common.init_torch()
        common.fix_malloc_threshold()
        self.s = common.make(f"per-sample/{inv}/full/fast:grid")
        small = self.s.new_statistics()
        for X, G in _batches(1, 4, seed=1):
            small.update(X, G)
        self.X, self.G = next(_batches(1, b))

    def peakmem_per_sample(self, inv, b):
        self.s.new_statistics().update(self.X, self.G)
