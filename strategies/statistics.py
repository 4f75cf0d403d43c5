"""Streaming statistics of ``(X, G)`` over any number of batches.

The base class keeps ``Σ_b A_b = Σ_b X_bᵀ X_b`` and ``Σ_b M_b = Σ_b X_bᵀ G_b X_b``
(two ``(d_e, d_e)`` matrices) and the sample count: memory independent of the number
of samples. Every strategy needs them (``E[M]`` is the plain gradient ``∂L/∂Z``,
``E[A]`` the metric of metric-aware truncation). Averaging formulas that need more
extend it in :mod:`strategies.averaging`.

Two more things make a step judge itself by data it did not fit (docs/mathematics.md §5.4):

- ``Σ M_b`` over the samples of even index (counted across batches) is kept too: ``Σ M_b`` is then
  formed as the sum of its two halves' products, no more arithmetic than one product, and the two
  halves of the samples give directions whose agreement estimates how much of a step's in-sample
  decrease is signal (:mod:`strategies.signal`). ``Statistics(split_half=False)`` keeps the two
  Gram sums alone, each one product: the least any growth pays, the statistics of the floor
  growths are timed against.
- The last batch's contribution is kept apart, so :meth:`Statistics.without_last` can hand
  a ``+holdout`` line search statistics that never saw the batch it chooses λ on. A cheap
  fingerprint of every batch (its shape, float64 sum and sum of squares) tells which batches
  the sums hold. The last batch's tensors are also remembered by identity (weak references,
  their memory and version counters, :meth:`Statistics.is_last`): a growth handed the very
  tensors of the last update reuses that batch's ``X_bᵀ G_b X_b`` instead of computing it again.

Precision: the first batch fixes the statistics' dtype and device, float32 for
float16/bfloat16 batches and float64 for a batch whose magnitude leaves float32's range
(:func:`strategies._checks.range_dtype`); later batches are converted to them, so batches
of mixed dtypes accumulate in one precision.
"""

from __future__ import annotations

import copy
import weakref

import torch
from torch import Tensor

from ._checks import check_batch, range_dtype
from .score_change import grams_pay
from .timing import timed


def _fingerprint(X: Tensor) -> Tensor:
    """``(Σx, Σx²)`` of a batch, ``(2,)`` float64: what tells one batch from another.

    Each row's ``d_e`` entries are reduced in ``X``'s own dtype (relative error ~``d_e · eps``, far below
    the 1e-5 that :meth:`Statistics.batch_index` tolerates), the rows' sums in float64: two passes over
    ``X`` and no copy of it, where a float64 copy of the whole batch cost 30 to 40 times more (and as
    much again in the floor every growth is measured against).
    """
    return torch.stack([X.sum(-1).double().sum(), torch.linalg.vector_norm(X, dim=-1).double().square().sum()])


def _identity(t: Tensor | None) -> tuple | None:
    """What makes ``t`` the same data later: its storage's owner (weakly), where it points, its layout and its
    version counter, which every in-place change (of it, or of a view of the same memory) advances."""
    if t is None:
        return None
    owner = t._base if t._base is not None else t
    return (weakref.ref(owner), t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t.device, t._version)


def _same(t: Tensor | None, identity: tuple | None) -> bool:
    """Whether ``t`` is the data ``identity`` (from :func:`_identity`) was taken of, unchanged since."""
    if t is None or identity is None:
        return t is None and identity is None
    ref, *rest = identity
    owner = t._base if t._base is not None else t
    # The owner still alive and the same object: its memory cannot have been freed and reused.
    return ref() is owner and rest == [t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t.device, t._version]


def _gram_sum(X: Tensor, per_sample: bool) -> tuple[Tensor, Tensor | None]:
    """``Σ_b X_bᵀ X_b`` of ``X`` ``(b, d_s, d_e)``, and with ``per_sample`` each sample's ``(b, d_e, d_e)``, whose
    sum it then is (otherwise one GEMM over the flattened batch, and None)."""
    if per_sample:
        grams = X.mT @ X
        return grams.sum(0), grams
    flat = X.reshape(-1, X.shape[-1])
    return flat.mT @ flat, None


class Statistics:
    """Running sums over samples; ``update`` once per batch.

    Attributes
    ----------
    n : int
        Number of samples (sequences) seen.
    sum_A, sum_M : Tensor
        ``Σ_b X_bᵀ X_b`` and ``Σ_b X_bᵀ G_b X_b``, each ``(d_e, d_e)``, in the dtype and on
        the device of the first batch (see the module docstring on precision).
    sum_M_even : Tensor or None
        ``Σ_b X_bᵀ G_b X_b`` over the samples of even index; None with ``split_half=False``.
    elapsed : float
        Seconds spent in ``update`` (synchronised on CUDA).
    host_reads : int
        Numbers read on the host while accumulating (on a GPU, a synchronisation each): the first batch's
        magnitude, which fixes the dtype, and whatever a subclass's products read.
    log : list of str
        Fallbacks that happened while accumulating.
    split_half : bool
        Keep ``Σ M_b`` over the samples of even index (:attr:`sum_M_even`, :meth:`half_sums`): what a ridge's
        strength, the split-half estimate and a one-batch ``+holdout`` split are made from. Default True, so that
        these statistics fit every strategy; a strategy's ``new_statistics`` keeps them only where it reads them.
        False keeps the two Gram sums alone, as the floor does, each one product over the batch (True splits
        ``Σ M_b``'s product in two, copying each half's rows: the same arithmetic, a different rounding).
    keep_one_batch : bool
        Keep, while the statistics hold one batch, the products a growth on that batch uses again: the rows of
        ``X`` and ``G X`` of its samples of even index (about ``X``'s size), so that :meth:`even_half` needs no
        product with ``G`` again, and, where :func:`~strategies.score_change.grams_pay` (unmasked, ``2 d_e² ≤
        d_s²``), each sample's ``X_bᵀ X_b`` (:attr:`sample_grams`, at most half ``G``'s size), whose sum is then
        ``Σ A_b`` and whose traces give a direction's ``‖X P Xᵀ‖``. A ``+holdout`` strategy's
        :meth:`~strategies.growth.GrowthStrategy.new_statistics` sets it; default False.
    """

    #: The class's default, for statistics pickled before the attribute existed (they kept the half sums).
    split_half: bool = True

    def __init__(self, keep_one_batch: bool = False, split_half: bool = True) -> None:
        self.keep_one_batch = keep_one_batch
        self.split_half = split_half
        self.n = 0
        self.tokens = 0
        self.sum_A: Tensor | None = None
        self.sum_M: Tensor | None = None
        self.sum_M_even: Tensor | None = None
        self.elapsed = 0.0
        self.host_reads = 0
        self.log: list[str] = []
        self._timings: dict[str, float] = {}
        #: Per batch: (shape, float64 sum and sum of squares of X) as tensors, compared only when a growth asks (no
        #: host sync here); None for a batch taken without one (``_add(..., fingerprint=False)``).
        self._fingerprints: list[tuple[tuple[int, ...], Tensor | None]] = []
        #: The last batch's contribution to every running sum, by attribute name (for :meth:`without_last`).
        self._last: dict[str, Tensor] = {}
        #: The last batch's ``(X, G, mask)`` as passed, by identity (:func:`_identity`), for :meth:`is_last`.
        self._last_inputs: tuple | None = None
        #: With ``keep_one_batch``, while the statistics hold one batch: the rows of ``X`` and of ``G X`` of its
        #: samples of even index, ``(b_even·d_s, d_e)`` each, as ``Σ M_even`` took them, for :meth:`even_half`
        #: (about X's size; dropped at the second batch).
        self._even_rows: tuple[Tensor, Tensor] | None = None
        #: With ``keep_one_batch``, while the statistics hold one batch that ``grams_pay``: ``X_bᵀ X_b`` per sample.
        self._sample_grams: Tensor | None = None

    def update(self, X: Tensor, G: Tensor, mask: Tensor | None = None) -> Statistics:
        """Accumulate one batch.

        Parameters
        ----------
        X : Tensor
            Inputs as the projections see them, ``(b, d_s, d_e)``. After the first batch,
            converted to the statistics' dtype and device.
        G : Tensor
            ``∂L/∂S``, ``(b, d_s, d_s)``; entries outside ``mask`` are treated as zero.
        mask : Tensor, optional
            Bool ``(d_s, d_s)`` or ``(b, d_s, d_s)``, True where attended.

        Returns
        -------
        Statistics
            ``self``, so calls can be chained.

        Raises
        ------
        ValueError
            Bad input (:func:`strategies._checks.check_batch`), or a ``d_e`` other than
            the statistics'.
        """
        return self._add(X, G, check_batch(X, G, mask))

    def _add(self, X: Tensor, G: Tensor, mask: Tensor | None, fingerprint: bool = True) -> Statistics:
        """``update`` on a batch already validated by :func:`check_batch` (a growth checks it once); without
        ``fingerprint``, :meth:`batch_index` can never find the batch (for statistics only a growth sees)."""
        if self.sum_A is not None and X.shape[-1] != self.sum_A.shape[-1]:
            raise ValueError(
                f"batch has d_e={X.shape[-1]}, {X.dtype} on {X.device} but the statistics hold "
                f"d_e={self.sum_A.shape[-1]}, {self.sum_A.dtype} on {self.sum_A.device}"
            )
        inputs = (_identity(X), _identity(G), _identity(mask))
        # One precision and device for every sum: the first batch's (float32 for half
        # precision, which torch cannot factorise), so that mixed batches add up instead of
        # failing inside torch with a dtype error.
        if self.sum_A is None:  # float64 for a float32 batch whose squares would leave float32's range
            dtype, device = range_dtype(X), X.device
            self.host_reads += 1
        else:
            dtype, device = self.sum_A.dtype, self.sum_A.device
        X, G = X.to(device=device, dtype=dtype), G.to(device=device, dtype=dtype)
        mask = None if mask is None else mask.to(device)
        with timed(self._timings, "update", X.device), torch.no_grad():
            if mask is not None:
                G = G.masked_fill(~mask, 0.0)
            d_e = X.shape[-1]
            GX = G @ X  # (b, d_s, d_e)
            # One GEMM over the flattened batch instead of b small ones. Where a growth on this one batch will want
            # each sample's Gram matrix, Σ A_b is their sum instead: the same work as the one GEMM, not twice it.
            A, grams = _gram_sum(X, self.keep_one_batch and self.sum_A is None and grams_pay(X, mask))
            # With split_half, Σ M_b is the sum of its two halves' products, the samples of even index and those of
            # odd index, counted from the first sample seen (every other one from the first or the second; slices,
            # not a boolean index): the same arithmetic as the one product, where a product of one half on top of it
            # cost 7-20 % of the statistics. Each batch's two halves then add up to its M exactly.
            even_rows = M_even = None
            if self.split_half:
                first = self.n % 2
                even_rows = (X[first::2].reshape(-1, d_e), GX[first::2].reshape(-1, d_e))
                M_even = even_rows[0].mT @ even_rows[1]
                M = M_even + X[1 - first::2].reshape(-1, d_e).mT @ GX[1 - first::2].reshape(-1, d_e)
            else:
                M = X.reshape(-1, d_e).mT @ GX.reshape(-1, d_e)
            last, self._last = self._last, {}
            try:  # first: a batch the subclass refuses (another d_s, a failed factorisation) leaves every sum as it was
                self._accumulate(X, G, GX, mask)
            except Exception:
                self._last = last
                raise
            for name, value in (("sum_A", A), ("sum_M", M), ("sum_M_even", M_even)):
                if value is not None:
                    self._add_to(name, value)
            self._fingerprints.append((tuple(X.shape), _fingerprint(X) if fingerprint else None))
            self._last_inputs = inputs
            one = self.keep_one_batch and self.n_batches == 1
            self._even_rows = even_rows if one else None
            self._sample_grams = grams if one else None
            self.n += X.shape[0]
            self.tokens += X.shape[0] * X.shape[1]
        self.elapsed = self._timings["update"]
        return self

    def _add_to(self, name: str, value: Tensor) -> None:
        """Add ``value`` to the running sum ``name`` and remember it as the last batch's contribution."""
        current = getattr(self, name)
        setattr(self, name, value if current is None else current + value)
        self._last[name] = value

    def even_samples(self, b: int, device: torch.device | str = "cpu") -> Tensor:
        """Which of the next ``b`` samples have an even index counted from the first sample seen, ``(b,)`` bool."""
        return (torch.arange(b, device=device) + self.n) % 2 == 0

    def half_sums(self) -> tuple[Tensor, Tensor]:
        """``Σ M_b`` over the samples of even index and over those of odd index, each ``(d_e, d_e)``.

        Raises
        ------
        ValueError
            Statistics made with ``split_half=False``, or empty ones.
        """
        self._require()
        if self.sum_M_even is None:
            raise ValueError("these statistics keep no split-half sums (made with split_half=False): accumulate the "
                             "batches into the strategy's own new_statistics()")
        return self.sum_M_even, self.sum_M - self.sum_M_even

    def even_half(self, X: Tensor, G: Tensor, mask: Tensor | None = None) -> Statistics | None:
        """The statistics of the samples of even index of ``(X, G, mask)``, the one batch these statistics hold, as
        ``update`` on them would make them up to the rounding of ``Σ M_b`` (a growth's one-batch ``+holdout``
        split); None where they cannot be derived: statistics of another batch count or size, or of a subclass,
        which keeps more than the Gram sums.

        Their ``Σ M_b`` is this one's ``sum_M_even`` already (one product, where ``update`` would add its two
        halves'); only ``Σ A_b`` over them and their own split (the samples of index ``0 mod 4``) are computed:
        about half the work of accumulating them afresh, ``Σ A_b`` and the split the same products of the same
        numbers. Where the statistics still hold the rows of ``X`` and ``G X`` their ``Σ M_even`` took, those serve
        (no copy of the half and no product with ``G`` again), and where they hold each sample's Gram matrix,
        ``Σ A_b`` over the half is a sum of those.
        """
        if (type(self) is not Statistics or self.sum_M_even is None or self.n_batches != 1 or self.n != X.shape[0]
                or X.shape[0] < 2):
            return None
        dtype, device = self.sum_A.dtype, self.sum_A.device
        half = Statistics()
        with timed(half._timings, "update", device), torch.no_grad():
            d_s, d_e = X.shape[1:]
            if self._even_rows is not None:
                even = self._even_rows[0]
                quarter, GX_quarter = (rows.view(-1, d_s, d_e)[0::2].reshape(-1, d_e) for rows in self._even_rows)
            else:
                X, G = X.to(device=device, dtype=dtype), G[0::4].to(device=device, dtype=dtype)
                if mask is not None:
                    G = G.masked_fill(~(mask if mask.dim() == 2 else mask[0::4]).to(device), 0.0)
                even, quarter = X[0::2].reshape(-1, d_e), X[0::4]
                GX_quarter, quarter = (G @ quarter).reshape(-1, d_e), quarter.reshape(-1, d_e)
            # As update() would sum them: from the samples' Gram matrices where it would keep those.
            sum_A = (self._sample_grams[0::2].sum(0) if self._sample_grams is not None
                     else _gram_sum(even.view(-1, d_s, d_e), self.keep_one_batch and grams_pay(X, mask))[0])
            sums = (("sum_A", sum_A), ("sum_M", self.sum_M_even), ("sum_M_even", quarter.mT @ GX_quarter))
            for name, value in sums:
                half._add_to(name, value)
            half._fingerprints.append(((X[0::2].shape[0], *X.shape[1:]), None))
            half.n = X[0::2].shape[0]
            half.tokens = half.n * X.shape[1]
        half.elapsed = half._timings["update"]
        return half

    def batch_index(self, X: Tensor) -> int | None:
        """The index of the batch ``X`` among those accumulated (by fingerprint), or None when it is not one.

        The same numbers in another precision are the same batch: the fingerprints (float64 sum and sum of
        squares) must agree to within float32's rounding of the entries, far below what separates two draws.
        One host transfer; a batch of another shape is never a match.
        """
        candidates = [i for i, (s, f) in enumerate(self._fingerprints) if s == tuple(X.shape) and f is not None]
        if not candidates:
            return None
        # In the sums' dtype, as update() took it: the same numbers then give the same fingerprint.
        mine = _fingerprint(X.to(device=self.sum_A.device, dtype=self.sum_A.dtype))
        theirs = torch.stack([self._fingerprints[i][1] for i in candidates])
        # |Σx − Σx'| ≤ 1e-5 √(n Σx²) and |Σx² − Σx'²| ≤ 1e-5 Σx²: float32 rounding moves each entry by 6e-8 of itself.
        scale = torch.stack([(X.numel() * mine[1]).sqrt(), mine[1]]).clamp_min(torch.finfo(torch.float64).tiny)
        close = ((theirs - mine).abs() <= 1e-5 * scale).all(dim=1).tolist()
        hits = [i for i, c in zip(candidates, close, strict=True) if c]
        return hits[-1] if hits else None

    def __getstate__(self) -> dict:
        """Pickled without the last batch's identity (weak references do not pickle, and the tensors they point to
        are not the unpickled copy's): such statistics find their last batch by fingerprint."""
        state = self.__dict__.copy()
        state["_last_inputs"] = None
        state["_even_rows"] = None  # a copy of the batch's size: even_half recomputes it where ever asked
        state["_sample_grams"] = None  # as large: a growth forms them again where they pay
        return state

    def is_last(self, X: Tensor, G: Tensor, mask: Tensor | None = None) -> bool:
        """Whether ``(X, G, mask)`` are the very tensors of the last :meth:`update`, unchanged since.

        Exact where :meth:`batch_index` compares fingerprints: the same tensor objects (or views of the same
        memory at the same place), their memory still owned by the objects it was then, and no in-place change
        since (their version counters). Copies of the same numbers are not the last batch by this test.
        """
        if self._last_inputs is None:
            return False
        return all(_same(t, i) for t, i in zip((X, G, mask), self._last_inputs, strict=True))

    @property
    def sample_grams(self) -> Tensor | None:
        """Each sample's ``X_bᵀ X_b``, ``(b, d_e, d_e)``, of the one batch these statistics hold, where they keep
        them (``keep_one_batch``, an unmasked batch for which they pay); None otherwise."""
        return self._sample_grams

    def last_batch_sum(self, name: str = "sum_M") -> Tensor | None:
        """The last batch's own contribution to the running sum ``name`` (None once taken out)."""
        return self._last.get(name)

    @property
    def n_batches(self) -> int:
        """Batches accumulated."""
        return len(self._fingerprints)

    def without_last(self) -> Statistics:
        """A copy of these statistics without the last batch accumulated (the sums minus its contribution).

        Raises
        ------
        ValueError
            Fewer than two batches, or the last batch already removed.
        """
        if self.n_batches < 2 or not self._last:
            raise ValueError("without_last needs at least two batches accumulated, the last one still in the sums")
        out = copy.copy(self)
        for name, value in self._last.items():
            setattr(out, name, getattr(self, name) - value)
        shape = self._fingerprints[-1][0]
        out.n -= shape[0]
        out.tokens -= shape[0] * shape[1]
        out._fingerprints = self._fingerprints[:-1]
        out._last = {}
        out._last_inputs = None
        out.log = list(self.log)
        return out

    def _accumulate(self, X: Tensor, G: Tensor, GX: Tensor, mask: Tensor | None) -> None:
        """Hook for subclasses that keep more than the two Gram sums."""

    def _require(self) -> None:
        if self.n == 0:
            raise ValueError("statistics are empty: call update(X, G) with at least one batch first")

    @property
    def mean_A(self) -> Tensor:
        """``E[XᵀX]``, ``(d_e, d_e)``."""
        self._require()
        return self.sum_A / self.n

    @property
    def mean_M(self) -> Tensor:
        """``E[XᵀGX]``, ``(d_e, d_e)``: the mean gradient with respect to ``Z``."""
        self._require()
        return self.sum_M / self.n
