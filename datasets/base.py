"""Base classes of the benchmark's data sets: a model wrapper and the dataset interface.

A growth is measured on one :class:`~models.block.GrowableAttention` block sitting
inside a small model ``embed -> block -> head -> loss`` (:class:`GrowthModel`). A
:class:`Dataset` makes deterministic batches and builds that model; every random draw
goes through a private generator seeded from ``(seed, purpose, split, index)`` so no
result depends on the global RNG or on the order in which batches are requested.
"""

from __future__ import annotations

import hashlib
import json
import math
import operator
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from growbench.models.block import GrowableAttention

SPLITS = ("train", "test")
#: Kinds of data, in the order the report answers for them: a synthetic task (its optimum known), a small
#: model trained on natural data (images, text), and a real pretrained model (answered per task).
KINDS = ("synthetic", "natural", "pretrained")


# ----------------------------------------------------------------------------- seeding
def derive_seed(*keys: int | str) -> int:
    """A 63-bit seed that depends on every key (ints or strings), stable across runs and platforms.

    Python's ``hash`` is salted per process and ``seed + k`` arithmetic makes streams of
    nearby seeds collide (seed 0's test stream = seed 1's train stream), so hash instead.
    """
    plain = [k if isinstance(k, str) else operator.index(k) for k in keys]  # numpy ints -> int
    blob = json.dumps(plain, separators=(",", ":")).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "little") >> 1


def torch_generator(*keys: int | str) -> torch.Generator:
    """A fresh CPU ``torch.Generator`` seeded by :func:`derive_seed` of ``keys``."""
    return torch.Generator().manual_seed(derive_seed(*keys))


# --------------------------------------------------------------------- model pieces
def sinusoidal_encoding(d_s: int, d_e: int, dtype: torch.dtype = torch.float32,
                        device: torch.device | str | None = None) -> Tensor:
    """Sinusoidal positional encoding (Vaswani et al.; seeds 002/004).

    ``PE[pos, 2i] = sin(pos / 10000^(2i/d_e))`` and ``PE[pos, 2i+1] = cos(pos / 10000^(2i/d_e))``;
    for odd ``d_e`` the last column is a sine.

    Parameters
    ----------
    d_s : int
        Number of positions.
    d_e : int
        Embedding width.

    Returns
    -------
    Tensor, (d_s, d_e)
    """
    pos = torch.arange(d_s, dtype=torch.float64).unsqueeze(1)
    two_i = torch.arange(0, d_e, 2, dtype=torch.float64)
    angle = pos / torch.pow(10000.0, two_i / d_e)  # (d_s, ceil(d_e/2))
    pe = torch.zeros(d_s, d_e, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d_e // 2])
    return pe.to(dtype=dtype, device=device)


def init_linear(in_features: int, out_features: int, gen: torch.Generator, *, bias: bool = True,
                dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> nn.Linear:
    """An ``nn.Linear`` drawn from ``gen``: weight ``N(0, 1/in_features)``, bias zero.

    ``skip_init`` avoids ``nn.Linear``'s own initialisation, which would draw from (and
    advance) the global RNG.
    """
    lin = nn.utils.skip_init(nn.Linear, in_features, out_features, bias=bias, dtype=dtype, device=device)
    with torch.no_grad():
        w = torch.randn(out_features, in_features, generator=gen, dtype=dtype) / math.sqrt(in_features)
        lin.weight.copy_(w)
        if bias:
            lin.bias.zero_()
    return lin


class PositionalEmbed(nn.Module):
    """``token_embed(inputs) + PE``: any per-token embedding followed by a sinusoidal encoding.

    Parameters
    ----------
    token_embed : nn.Module
        Maps inputs ``(b, L, ...)`` to ``(b, L, d_e)``, ``L <= d_s``.
    d_s, d_e : int
        Maximum sequence length and embedding width of the encoding.
    """

    def __init__(self, token_embed: nn.Module, d_s: int, d_e: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.token_embed = token_embed
        # Non-persistent: it is a function of the shapes, so it need not be cached or loaded.
        self.register_buffer("pe", sinusoidal_encoding(d_s, d_e, dtype, device), persistent=False)

    def forward(self, inputs: Tensor) -> Tensor:
        """Embed ``inputs`` (b, L, ...) to ``(b, L, d_e)``."""
        E = self.token_embed(inputs)
        return E + self.pe[: E.shape[1]]


class GrowthModel(nn.Module):
    """``embed -> GrowableAttention block -> head -> loss``.

    Parameters
    ----------
    embed : nn.Module
        Maps a batch of inputs to the block's input ``X`` of shape ``(b, d_s, d_e)``.
    block : GrowableAttention
        The block whose ``d_k`` is grown.
    head : nn.Module
        Maps the block output ``Y`` (b, d_s, d_e) to predictions.
    loss_fn : Callable[[Tensor, Tensor], Tensor]
        ``loss_fn(predictions, targets)`` -> scalar, the mean over the batch.
    """

    def __init__(self, embed: nn.Module, block: GrowableAttention, head: nn.Module,
                 loss_fn: Callable[[Tensor, Tensor], Tensor]) -> None:
        super().__init__()
        self.embed = embed
        self.block = block
        self.head = head
        self.loss_fn = loss_fn

    @property
    def dtype(self) -> torch.dtype:
        """Floating dtype of the block's parameters."""
        return self.block.W_O.dtype

    @property
    def device(self) -> torch.device:
        """Device of the block's parameters."""
        return self.block.W_O.device

    def _cast(self, t: Tensor) -> Tensor:
        # Datasets emit float32 / int64 CPU tensors; the model may be float64 or on a GPU.
        if t.is_floating_point():
            return t.to(dtype=self.dtype, device=self.device)
        return t.to(device=self.device)

    def embed_inputs(self, inputs: Tensor) -> Tensor:
        """The block's input.

        Parameters
        ----------
        inputs : Tensor
            A batch as returned by :meth:`Dataset.batch` (any dtype/device).

        Returns
        -------
        Tensor, (b, d_s, d_e)
        """
        return self.embed(self._cast(inputs))

    def forward(self, inputs: Tensor) -> Tensor:
        """Predictions ``head(block(embed(inputs)))``."""
        return self.head(self.block(self.embed_inputs(inputs)))

    def rest(self, targets: Tensor) -> Callable[[Tensor], Tensor]:
        """The part of the network after the block, as a loss of the block output.

        Parameters
        ----------
        targets : Tensor
            Targets of the batch whose block output will be passed.

        Returns
        -------
        Callable[[Tensor], Tensor]
            ``Y (b, d_s, d_e) -> loss_fn(head(Y), targets)``, a scalar; uses the head's
            parameters as they are when called.
        """
        t = self._cast(targets)

        def fn(Y: Tensor) -> Tensor:
            return self.loss_fn(self.head(Y), t)

        return fn

    def loss(self, inputs: Tensor, targets: Tensor) -> Tensor:
        """Scalar loss of a batch, the mean over the batch."""
        return self.rest(targets)(self.block(self.embed_inputs(inputs)))


# ---------------------------------------------------------------------------- dataset
def _coerce(name: str, value: Any, default: Any) -> Any:
    """``value`` converted to the type of ``default`` so equal options give equal cache keys (4 == 4.0)."""
    try:
        if isinstance(default, bool):
            if isinstance(value, str) and value.lower() in ("true", "false"):
                return value.lower() == "true"
            if value in (0, 1):
                return bool(value)
            raise ValueError
        if isinstance(default, int):
            f = float(value)
            if not f.is_integer():
                raise ValueError
            return int(f)
        if isinstance(default, float):
            f = float(value)
            if not math.isfinite(f):
                raise ValueError
            return f
        return type(default)(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"option {name}={value!r} is not a valid {type(default).__name__}"
        ) from None


def _as_int(name: str, value: Any) -> int:
    """``value`` as a Python int; numpy integers (e.g. from pandas sweep tables) are accepted."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an int, got {value!r}")
    try:
        return operator.index(value)  # a plain int keeps json.dumps (cache keys) working
    except TypeError:
        raise ValueError(f"{name} must be an int, got {value!r}") from None


def _check_int(name: str, value: Any, minimum: int) -> int:
    v = _as_int(name, value)
    if v < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return v


class Dataset(ABC):
    """A source of deterministic batches and of the model that learns them.

    Parameters
    ----------
    d_e : int
        Width of the block's input ``X``.
    d_s : int
        Sequence length.
    seed : int
        Seed of the data stream and of the model initialisation.
    **options
        Dataset-specific options; the accepted ones and their defaults are ``defaults``.

    Raises
    ------
    ValueError
        An unknown option, an option of the wrong type, or unsupported ``d_e``/``d_s``.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    #: What kind of data it is, for the report's plain answers: one of :data:`KINDS`.
    kind: ClassVar[str]
    #: For a pretrained model, what it is asked to do (``"head recovery"``, its own objective), which the report
    #: answers for separately; None for the others.
    task: ClassVar[str | None] = None
    defaults: ClassVar[dict[str, Any]] = {}
    causal: bool = False
    #: Where training's ``fixed-large`` starts: at ``d_k_max`` as :meth:`build_model` makes it (False), or at ``d_k0``
    #: widened by small random columns (True): for a model whose narrowing at ``d_k_max`` would hand fixed-large
    #: information growth is recovering (a pretrained head's best factors of that rank).
    fixed_large_from_narrowed: ClassVar[bool] = False
    #: Whether one call of the loss of a head's scores reruns a large model (the decoder's 4 layers and 49 152-word
    #: output): a sweep run then measures its diagnostics along λ more coarsely (``harness.measure``).
    costly_loss: ClassVar[bool] = False
    compute_device: torch.device = torch.device("cpu")

    def __init__(self, d_e: int, d_s: int, seed: int = 0, **options: Any) -> None:
        self.d_e = _check_int(f"{self.name}: d_e", d_e, 1)
        self.d_s = _check_int(f"{self.name}: d_s", d_s, 1)
        self.seed = _as_int(f"{self.name}: seed", seed)
        unknown = sorted(set(options) - set(self.defaults))
        if unknown:
            valid = ", ".join(sorted(self.defaults)) or "none"
            raise ValueError(f"{self.name}: unknown option(s) {', '.join(unknown)}; valid options: {valid}")
        self._options = {k: _coerce(f"{self.name}: {k}", options.get(k, v), v) for k, v in self.defaults.items()}

    def options(self) -> dict[str, Any]:
        """Every option that affects the data or the model, JSON-serialisable.

        ``d_e``, ``d_s`` and ``seed`` are not included: they are attributes.
        """
        return dict(self._options)

    def compute_on(self, device: torch.device | str) -> Dataset:
        """Compute later batches on ``device``; returns ``self``.

        Only a dataset whose batches cost real work (the teacher's float64 forward, about 2 TFLOP a batch at
        d_e = 4096) uses it; the others build their batches on the CPU whatever it says. The random draw stays
        on the CPU generator, so a batch's values depend on the device only by rounding, and on the CPU they
        are the same as without the call.
        """
        self.compute_device = torch.device(device)
        return self

    def _check_batch_args(self, b: int, split: str, index: int) -> None:
        _check_int("b", b, 1)
        _check_int("index", index, 0)
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")

    def _generator(self, purpose: str, split: str = "", index: int = 0) -> torch.Generator:
        """Private generator for one purpose (``"data"``, ``"model"``, ...) and batch."""
        return torch_generator(self.name, self.seed, purpose, split, index)

    @abstractmethod
    def batch(self, b: int, split: str = "train", index: int = 0) -> tuple[Tensor, Tensor]:
        """One batch ``(inputs, targets)``, a pure function of ``(seed, split, index)``.

        Parameters
        ----------
        b : int
            Batch size.
        split : {"train", "test"}
        index : int
            Batch number (>= 0); the warm-up uses ``index = step``.

        Returns
        -------
        tuple[Tensor, Tensor]
            CPU tensors; their shapes are given by each dataset.
        """

    @abstractmethod
    def build_model(self, d_k: int, *, n_heads: int = 1, bias: bool = False, scale_policy: str = "rescale",
                    dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> GrowthModel:
        """A fresh, untrained model whose block has query/key width ``d_k``; deterministic in ``seed``."""

    def _block(self, d_k: int, gen: torch.Generator, *, n_heads: int, bias: bool, scale_policy: str,
               dtype: torch.dtype, device: torch.device | str, d_v: int | None = None) -> GrowableAttention:
        return GrowableAttention(self.d_e, d_k, d_v=d_v, n_heads=n_heads, bias=bias, causal=self.causal,
                                 scale_policy=scale_policy, generator=gen, dtype=dtype, device=device)

    def __repr__(self) -> str:
        opts = "".join(f", {k}={v!r}" for k, v in self._options.items())
        return f"{type(self).__name__}(d_e={self.d_e}, d_s={self.d_s}, seed={self.seed}{opts})"
