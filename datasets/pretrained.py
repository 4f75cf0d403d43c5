"""What the datasets of real pretrained models share: the text, the model wrapper, and the checks made before loading.

A pretrained model's dataset (:class:`PretrainedDataset`: all-MiniLM-L6-v2 in :mod:`datasets.minilm`,
SmolLM2-135M in :mod:`datasets.smollm`) runs the model on windows of one token stream, the text of
option ``corpus``: ``pydoc`` (the default, Python's help texts) or the path of a UTF-8 text file of the
user's (no ``:`` in it; at most :data:`CORPUS_MAX_BYTES`), split 90/10 into train and test windows; its
sha256 is part of the options, so runs on two different files never share a key or a cache entry.
Nothing in the file is run.

The checks a sweep makes before any work (options, sizes, whether the weights are installed) are class
methods that never load the model: the harness calls them through the dataset class, whatever the model.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import math
import stat
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from .base import Dataset
from .text import TRAIN_FRACTION, corpus

#: The corpus option's name for the built-in text (Python's help texts, :func:`datasets.text.corpus`).
BUILTIN_CORPUS = "pydoc"
#: A corpus file larger than this is refused: tokenising it would take minutes and hold its ids in memory.
CORPUS_MAX_BYTES = 64 * 2**20
#: Where the weights come from: the packaged pretrained ones, or the architecture with seeded random weights
#: (the same code path without the package: what CI tests).
SOURCES = ("pretrained", "random")
#: Heads made growable: the one head (layer, head), every head of `layer`, every head of every layer.
NARROW = ("head", "layer", "all")


def corpus_text(name: str, dataset: str = "pretrained") -> tuple[str, str]:
    """The text of option ``corpus`` and its sha256 (hex).

    Parameters
    ----------
    name : str
        :data:`BUILTIN_CORPUS` or the path of a UTF-8 text file.
    dataset : str
        The dataset's name, for the messages.

    Raises
    ------
    ValueError
        One line naming the file: missing, not a regular file (a FIFO would block), larger than
        :data:`CORPUS_MAX_BYTES`, not UTF-8 (with the byte offset), or holding no text.
    """
    if name == BUILTIN_CORPUS:
        text = corpus()
        return text, hashlib.sha256(text.encode()).hexdigest()
    path = Path(name)
    what = f"{dataset}: corpus {name!r}"
    try:
        info = path.stat()
    except OSError as e:
        raise ValueError(f"{what}: cannot be read ({e.strerror or type(e).__name__}); give a UTF-8 text file "
                         f"or {BUILTIN_CORPUS!r}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"{what}: not a regular file")
    if info.st_size > CORPUS_MAX_BYTES:
        raise ValueError(f"{what}: {info.st_size} bytes, more than the {CORPUS_MAX_BYTES} a corpus may have")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ValueError(f"{what}: cannot be read ({e.strerror or type(e).__name__})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{what}: not UTF-8 text (byte {e.start})") from None
    if not text.strip():
        raise ValueError(f"{what}: holds no text")
    return text, hashlib.sha256(raw).hexdigest()


@functools.cache
def file_digest(path: Path) -> str:
    """The first 16 hex digits of a file's sha256 (read once per process)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def mse_loss(H: Tensor, target: Tensor) -> Tensor:
    """Head recovery's loss: the mean squared error between two last hidden states (b, d_s, d_e)."""
    return nn.functional.mse_loss(H, target)


def check_int_option(name: str, key: str, value: Any, count: int) -> None:
    """Refuse ``value`` unless it is an integer in ``0..count-1`` (a string from a dataset spec is parsed)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not number.is_integer():
        raise ValueError(f"{name}: option {key}={value!r} is not a valid int")
    if not 0 <= number < count:
        raise ValueError(f"{name}: {key} {value} out of range; valid {key}s: 0..{count - 1}")


class PretrainedModel(nn.Module):
    """A pretrained model with growable heads, and a loss of its last hidden state.

    Offers :class:`~datasets.base.GrowthModel`'s interface (``block``, ``loss``, ``rest``, ``dtype``,
    ``device``). Only the heads' factors are parameters; the model stays in eval mode (no dropout) even
    under ``train()``, so a growth and its losses are deterministic.

    Parameters
    ----------
    block : nn.Module
        The growth site (it holds the transformers model as ``encoder``).
    loss_fn : Callable[[Tensor, Tensor], Tensor]
        ``loss_fn(last_hidden (b', d_s, d_e), targets)`` -> scalar.
    pair_inputs : bool
        Inputs are (b, 2, d_s) text pairs, run as 2b sequences.
    forward_options : dict, optional
        Keyword arguments of every call of the model (a decoder's ``use_cache=False``).
    """

    def __init__(self, block: nn.Module, loss_fn, pair_inputs: bool = False,
                 forward_options: dict | None = None) -> None:
        super().__init__()
        self.block = block
        self.loss_fn = loss_fn
        self.pair_inputs = pair_inputs
        self.forward_options = dict(forward_options or {})

    @property
    def encoder(self) -> nn.Module:
        """The ``transformers`` model that returns the last hidden state (its own, deep-copied, module)."""
        return self.block.encoder

    @property
    def dtype(self) -> torch.dtype:
        """Floating dtype of the heads' factors."""
        return next(self.block.parameters()).dtype

    @property
    def device(self) -> torch.device:
        """Device of the heads' factors."""
        return next(self.block.parameters()).device

    def train(self, mode: bool = True) -> PretrainedModel:
        """Set ``training`` on this wrapper only; the model stays in eval mode."""
        self.training = mode
        return self

    def forward(self, inputs: Tensor) -> Tensor:
        """Last hidden state, (b, d_s, d_e) (or (2b, d_s, d_e) for pairs)."""
        ids = inputs.to(self.device)
        if self.pair_inputs:
            ids = torch.cat([ids[:, 0], ids[:, 1]])
        if hasattr(self.block, "last_hidden"):  # a site that can skip the layers before it on a batch seen before
            return self.block.last_hidden(ids, **self.forward_options)
        return self.encoder(input_ids=ids, **self.forward_options).last_hidden_state

    def rest(self, targets: Tensor) -> Any:
        """``last_hidden -> loss_fn(last_hidden, targets)``, the part after the head as a function."""
        t = targets.to(self.device)
        t = t.to(self.dtype) if t.is_floating_point() else t
        return lambda H: self.loss_fn(H, t)

    def loss(self, inputs: Tensor, targets: Tensor) -> Tensor:
        """Scalar loss of a batch."""
        return self.rest(targets)(self(inputs))


class PretrainedDataset(Dataset):
    """A real pretrained model's dataset: options, the corpus's token stream, windows, and the checks.

    Subclasses name the model and its architecture and provide :meth:`tokens`, :meth:`load` and
    :meth:`build_model`; :meth:`weights_available` says whether the packaged weights are installed.
    Options: ``layer`` and ``head`` (where the growable head sits), ``source`` (:data:`SOURCES`),
    ``narrow`` (:data:`NARROW`) and ``corpus``, plus any a subclass adds to ``defaults``.
    """

    kind = "pretrained"
    #: The model's name as a reader knows it.
    model_name: ClassVar[str]
    #: Its architecture: ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``, ``max_position_embeddings``.
    architecture: ClassVar[dict[str, int]]
    #: How to install what the model needs, for the messages.
    extra_hint: ClassVar[str]
    #: Whether its query/key projections have biases (the head's input then carries a ones column).
    bias: ClassVar[bool]
    #: The shortest window the model takes (special tokens included).
    min_d_s: ClassVar[int] = 2
    pair_inputs = False

    # ------------------------------------------------------------ checks, without loading the model
    @classmethod
    def weights_available(cls) -> bool:
        """Whether the packaged pretrained weights are installed."""
        raise NotImplementedError

    @classmethod
    def layer_count(cls, options: dict[str, Any]) -> int:
        """Layers of the model that ``options`` (its ``source``) builds."""
        return cls.architecture["num_hidden_layers"]

    @classmethod
    def check_options(cls, options: dict[str, Any], name: str | None = None) -> None:
        """The option checks, without loading the model (a sweep is checked before it runs).

        Raises
        ------
        ValueError
            A layer or head out of range, an unknown source or ``narrow`` (the message lists the valid
            values), a corpus file that cannot serve (:func:`corpus_text`), or ``transformers`` missing
            (the message names what to install).
        """
        name = name or cls.name
        counts = {"layer": cls.layer_count(options), "head": cls.architecture["num_attention_heads"]}
        for key, count in counts.items():
            if key in options:
                check_int_option(name, key, options[key], count)
        for key, valid in (("source", SOURCES), ("narrow", NARROW)):
            if key in options and options[key] not in valid:
                raise ValueError(f"{name}: {key} must be one of {', '.join(valid)}, got {options[key]!r}")
        if "corpus" in options:
            corpus_text(str(options["corpus"]), name)
        if importlib.util.find_spec("transformers") is None:
            raise ValueError(f"{name}: the real model needs transformers: {cls.extra_hint}")

    @classmethod
    def check_sizes(cls, d_e: int, d_s: int, d_k: int | None = None, p: int = 0, name: str | None = None) -> None:
        """The size checks, without loading the model.

        Raises
        ------
        ValueError
            ``d_e`` is not the model's width, ``d_s`` is outside the windows the model takes, or ``d_k + p``
            exceeds the head's input width (``d_e``, plus a ones column with biases).
        """
        name = name or cls.name
        width, longest = cls.architecture["hidden_size"], cls.architecture["max_position_embeddings"]
        if d_e != width:
            raise ValueError(f"{name}: d_e must be {width} (the pretrained model's width), got {d_e}")
        if not cls.min_d_s <= d_s <= longest:
            raise ValueError(f"{name}: d_s must be in {cls.min_d_s}..{longest}, got {d_s}")
        d_in = cls.input_width(d_e)
        if d_k is not None and not 1 <= d_k + p <= d_in:
            why = " (the head's input has a ones column)" if cls.bias else ""
            raise ValueError(f"{name}: d_k + p must be in 1..{d_in}{why}, got {d_k} + {p}")

    @classmethod
    def input_width(cls, d_e: int) -> int:
        """``d_in``, the width of the input the head's factors act on."""
        return d_e + 1 if cls.bias else d_e

    @classmethod
    def missing(cls, options: dict[str, Any]) -> str | None:
        """Why the dataset cannot run here (one line naming what to install), or None when it can."""
        if importlib.util.find_spec("transformers") is None:
            return f"{cls.name} needs transformers: {cls.extra_hint}"
        if options.get("source", cls.defaults["source"]) != "random" and not cls.weights_available():
            return f"{cls.name} needs the pretrained {cls.model_name} weights: {cls.extra_hint}"
        return None

    @classmethod
    def site_count(cls, options: dict[str, Any]) -> int:
        """How many heads option ``narrow`` (default ``head``) makes growable."""
        heads = cls.architecture["num_attention_heads"]
        return {"head": 1, "layer": heads, "all": heads * cls.layer_count(options)}[options.get("narrow", "head")]

    # ------------------------------------------------------------ the data
    def __init__(self, d_e: int, d_s: int, seed: int = 0, **options: Any) -> None:
        super().__init__(d_e, d_s, seed, **options)
        o = self._options
        self.check_options(o)
        self.check_sizes(self.d_e, self.d_s)
        # Read and hashed once: options() names the text by this digest.
        text, self._corpus_sha256 = corpus_text(o["corpus"], self.name)
        self._stream = self.tokens(o["source"], text, self._corpus_sha256)
        self.boundary = int(TRAIN_FRACTION * self._stream.shape[0])
        if self.window_tokens() >= self._stream.shape[0] - self.boundary:
            raise ValueError(f"{self.name}: d_s={self.d_s} is longer than the test text allows")
        # The seed only draws random weights: every seed shares one copy of the pretrained ones.
        self._reference = self.load(o["source"], self.seed if o["source"] == "random" else 0)

    def window_tokens(self) -> int:
        """Consecutive tokens of the stream one sample takes."""
        return self.d_s

    @classmethod
    def tokens(cls, source: str, text: str, digest: str) -> Tensor:
        """The token ids of ``text`` (n,) int64, without special tokens; ``digest`` is its sha256."""
        raise NotImplementedError

    @classmethod
    def load(cls, source: str, seed: int = 0) -> nn.Module:
        """The model, frozen, in eval mode, float32 on CPU (callers copy it before changing it)."""
        raise NotImplementedError

    @classmethod
    def weights_file(cls) -> Path:
        """The file whose digest names the pretrained weights in :meth:`options`."""
        raise NotImplementedError

    def options(self) -> dict[str, Any]:
        """The options, each left out at its default where the default predates the option (``narrow``'s
        ``head``, ``corpus``'s ``pydoc``), so that a run's options are what they were before it existed; a
        corpus file's sha256 prefix identifies its text, the weights' the pretrained model."""
        out = dict(self._options)
        if out["narrow"] == "head":
            del out["narrow"]
        if out["corpus"] == BUILTIN_CORPUS:
            del out["corpus"]
        else:
            out["corpus_sha256"] = self._corpus_sha256[:16]
        if out["source"] == "pretrained":
            out["weights_sha256"] = file_digest(self.weights_file())
        return out

    def windows(self, b: int, split: str, index: int, length: int) -> Tensor:
        """``b`` runs of ``length`` consecutive token ids from ``split``'s part of the stream, (b, length)."""
        self._check_batch_args(b, split, index)
        lo, hi = (0, self.boundary) if split == "train" else (self.boundary, self._stream.shape[0])
        gen = self._generator("data", split, index)
        starts = lo + torch.randint(0, hi - lo - length, (b,), generator=gen)
        return self._stream[starts.unsqueeze(1) + torch.arange(length)]

    def sites(self) -> list[tuple[int, int]]:
        """The ``(layer, head)`` pairs option ``narrow`` makes growable, in order."""
        o = self._options
        n_layers, n_heads = self.layer_count(o), self.architecture["num_attention_heads"]
        if o["narrow"] == "head":
            return [(o["layer"], o["head"])]
        layers = [o["layer"]] if o["narrow"] == "layer" else range(n_layers)
        return [(layer, head) for layer in layers for head in range(n_heads)]

    def check_build(self, d_k: int, n_heads: int) -> None:
        """The checks of :meth:`build_model`'s arguments common to every pretrained model."""
        if n_heads != 1:
            raise ValueError(f"{self.name}: option narrow ({', '.join(NARROW)}) chooses the growable heads; "
                             f"n_heads must be 1, got {n_heads}")
        d_in = self.input_width(self.d_e)
        if not 1 <= d_k <= d_in:
            raise ValueError(f"{self.name}: d_k must be in 1..{d_in}, got {d_k}")
