"""Building a strategy from its spec: one registered component per axis, composed.

``make("default")`` builds a :class:`DefaultStrategy`, which resolves its regime (device
kind × band of widths) from the inputs of each call and runs that regime's choice.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping

from torch import Tensor

from .growth import GrowthStrategy, StepContext, Strategy, _first_line
from .registry import REGISTRY
from .result import GrowthResult
from .spec import DEFAULT_FILE, DefaultChoice, Spec, default_choice, default_file_specs
from .statistics import Statistics


def make(
    spec: str | Spec,
    *,
    averaging: dict | None = None,
    inverse: dict | None = None,
    truncation: dict | None = None,
    line_search: dict | None = None,
    baseline: dict | None = None,
) -> Strategy:
    """Build a strategy from a spec string, a :class:`Spec` or a preset name.

    Parameters
    ----------
    spec : str or Spec
        E.g. ``"gram/solve/rsvd+metric/fast:newton"``, ``"formula1"``, ``"default"``, ``"gradmax"``.
        ``"default"`` gives a :class:`DefaultStrategy` (the regime's choice, resolved per call).
    averaging, inverse, truncation, line_search, baseline : dict, optional
        Keyword options of each component's constructor, e.g.
        ``inverse={"rtol": 1e-6}``, ``truncation={"oversample": 16, "n_iter": 4}``,
        ``averaging={"tol": 1e-8}`` (joint), ``line_search={"newton_steps": 2}``,
        ``line_search={"damping": 0.3}`` (with ``+damp``).

    Returns
    -------
    Strategy
        With ``spec``, ``direction``, ``grow`` and ``new_statistics``.

    Raises
    ------
    ValueError
        An unknown spec; an option dict that is not a dict; an option its component does not take (or one the
        spec sets, such as ``line_search={"holdout": True}``); a value the component refuses. The message names
        the axis and the option.
    """
    options = {axis: _options(axis, value) for axis, value in
               (("averaging", averaging), ("inverse", inverse), ("truncation", truncation),
                ("line_search", line_search), ("baseline", baseline))}
    if isinstance(spec, str) and spec.strip().lower() == "default":
        if options["baseline"]:
            raise ValueError("baseline=... options only apply to the baselines")
        return DefaultStrategy(**{k: v for k, v in options.items() if k != "baseline"})
    parsed = spec if isinstance(spec, Spec) else Spec.parse(spec)
    if parsed.is_baseline:
        if any(options[axis] for axis in ("averaging", "inverse", "truncation", "line_search")):
            raise ValueError(f"baseline {parsed.baseline!r} only takes baseline=... options")
        return _component("baseline", parsed.baseline, options["baseline"])
    if options["baseline"]:
        raise ValueError("baseline=... options only apply to the baselines")
    inv = _component("inverse", parsed.inverse, options["inverse"])
    avg = _component("averaging", parsed.averaging, options["averaging"], inv)
    trunc = _component("truncation", parsed.truncation, options["truncation"], metric=parsed.metric)
    flags = {flag: getattr(parsed, flag) for flag in Spec.LINE_SEARCH_FLAGS}
    ls = _component("line_search", parsed.line_search, options["line_search"], method=parsed.method, **flags)
    return GrowthStrategy(avg, trunc, ls, str(parsed))


def _options(axis: str, value: object) -> dict:
    """The options of one axis as a dict; ``ValueError`` for anything but None or a dict with string keys."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{axis}= must be a dict of option names to values, e.g. {axis}={{...}}, got "
                         f"{type(value).__name__} {value!r:.60}")
    names = [k for k in value if not isinstance(k, str)]
    if names:
        raise ValueError(f"{axis}= option names must be strings, got {names[0]!r}")
    return dict(value)


def _component(axis: str, name: str, options: dict, *args: object, **fixed: object) -> object:
    """``REGISTRY[axis][name](*args, **fixed, **options)``, with every option checked against the constructor.

    An option it does not take, or one the spec sets (``fixed``), is refused by name before anything is built;
    a value it refuses with ``TypeError`` (a string compared with a bound, say) becomes a ``ValueError`` naming
    that option, found by building the component with each option alone (constructors are cheap and pure).
    """
    cls = REGISTRY[axis][name]
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):  # a constructor without a signature (a C type): let it judge its options
        params = None
    if params is not None and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        positional = [n for n, p in params.items() if p.kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                                   inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        taken = [n for n, p in params.items() if n not in positional[:len(args)] and n not in fixed
                 and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
        for option in options:
            if option in fixed:
                raise ValueError(f"{axis} option {option!r} is set by the spec ({name}: {option}={fixed[option]!r}), "
                                 "not by an option")
            if option not in taken:
                raise ValueError(f"{axis} option {option!r} is not one {name!r} takes; it takes "
                                 f"{', '.join(taken) if taken else 'none'}")
    try:
        return cls(*args, **fixed, **options)
    except TypeError as e:
        for option, value in options.items():
            try:
                cls(*args, **fixed, **{option: value})
            except TypeError as alone:
                raise ValueError(f"{axis} option {option}={value!r:.60} is not a value {name!r} takes "
                                 f"({_first_line(alone)})") from None
            except ValueError:
                raise
        raise ValueError(f"{axis} options {options!r:.80} for {name!r}: {_first_line(e)}") from None


def _fewer_statistics(chosen: DefaultChoice, info: dict) -> str:
    """One line in a user's words when the growth's statistics are fewer than those with which the regime's choice
    was shown to generalise (batches, or tokens per entry of ``P``); empty otherwise."""
    batches, per_entry = info.get("statistics_batches"), info.get("tokens_per_d_e2")
    few_batches = chosen.batches is not None and isinstance(batches, int) and batches < chosen.batches
    few_tokens = (chosen.tokens_per_entry is not None and isinstance(per_entry, int | float)
                  and per_entry < chosen.tokens_per_entry)
    if not (few_batches or few_tokens):
        return ""
    had = f"{batches} batch{'es' if batches != 1 else ''}, {per_entry:.3g} tokens per entry of P"
    needed = " and ".join(part for part in (
        f"{chosen.batches} batches" if chosen.batches is not None else "",
        f"{chosen.tokens_per_entry:.3g} per entry" if chosen.tokens_per_entry is not None else "") if part)
    return (f"statistics: {had}; the default here was shown to generalise with {needed} ({DEFAULT_FILE}): "
            "accumulate more batches (stats.update) before growing")


class DefaultStrategy(Strategy):
    """The ``default`` preset: each call runs the choice of the regime of its inputs.

    The regime (:class:`strategies.regimes.Regime`) comes from ``X``'s device and width
    ``d_e``; its spec from ``strategies/default.json`` (:func:`strategies.spec.default_choice`,
    nearest regime with evidence when it has none). The result's ``spec`` is the spec that
    ran; ``info["default_regime"]`` names the regime, and a borrowed choice is recorded in
    ``fallback``, as is a regime where the evidence says growth does not generalise. The
    regime's verdict and where its evidence is (``default.json``, the report's "What to use")
    are ``info["default_evidence"]``, one line.

    **The statistics it needs.** ``info["statistics_needed"]`` holds the fewest statistics
    batches and tokens per entry of ``P`` (``tokens / d_e²``) with which the regime's evidence
    shows its choice lowering the held-out loss beyond noise (in the ``default.json`` of
    2026-11-26: 4 batches and 4 tokens per entry for ``cpu, d_e ≤ 128``, 2 batches and 0.0035
    per entry for ``128 < d_e ≤ 1024``); ``info["statistics_batches"]`` and
    ``info["tokens_per_d_e2"]`` what the growth had. With fewer, ``fallback`` says so in one
    line. A ``+holdout`` choice with one
    statistics batch adapts (the direction from half its samples, λ chosen on the other half,
    then a refit on all of them) and says that too; a step that ends at λ = 0 always says why
    (a line starting ``no step:``).

    Parameters
    ----------
    averaging, inverse, truncation, line_search : dict, optional
        Component options, as for :func:`make`, passed to whichever spec runs. Checked when the
        default is made against every spec ``default.json`` names: an option one of them does not
        take is a ``ValueError`` naming it.
    """

    spec = "default"

    def __init__(self, **options: dict | None) -> None:
        self.options = options
        self._built: dict[str, GrowthStrategy] = {}
        # Every spec the default may run is built now, so that an option no component of theirs takes (or a value
        # one refuses) is refused here, by name, and not at the first growth.
        for spec in default_file_specs():
            try:
                self._built[spec] = make(spec, **options)
            except ValueError as e:
                raise ValueError(f"default, which runs {spec} in some regime: {e}") from None

    def choice(self, device: object, d_e: int) -> DefaultChoice:
        """Which spec runs for inputs on ``device`` of width ``d_e``, and why."""
        return default_choice(device, d_e)

    def resolve(self, device: object, d_e: int) -> GrowthStrategy:
        """The strategy that runs for inputs on ``device`` of width ``d_e`` (built once per spec)."""
        return self._built_for(self.choice(device, d_e))

    def _built_for(self, chosen: DefaultChoice) -> GrowthStrategy:
        if chosen.spec not in self._built:
            self._built[chosen.spec] = make(chosen.spec, **self.options)
        return self._built[chosen.spec]

    def _for(self, tensor: Tensor) -> GrowthStrategy:
        return self.resolve(tensor.device, int(tensor.shape[-1]))

    def new_statistics(self) -> Statistics:
        """Empty statistics of the reference regime's choice.

        Every built-in averaging but ``per-sample`` and ``joint`` keeps the same sums (with the half sums, which
        every choice so far reads); if the regime of the data needs another kind, :meth:`grow` says which to build.
        """
        return make(default_choice().spec, **self.options).new_statistics()

    def direction(self, X: Tensor | Statistics, G: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
        """The direction of the regime's choice (regime from ``X``, or from the statistics' sums)."""
        like = X.sum_A if isinstance(X, Statistics) and X.sum_A is not None else X
        if not isinstance(like, Tensor):
            raise ValueError("direction(stats): the statistics are empty (call update first)")
        return self._for(like).direction(X, G, mask)

    def grow(self, W_Q: Tensor, W_K: Tensor, X: Tensor, G: Tensor, p: int,
             loss_of_scores: Callable[[Tensor], Tensor], scale: float | None = None, new_scale: float | None = None,
             mask: Tensor | None = None, stats: Statistics | None = None,
             scores: Tensor | None = None, loss_before: float | Tensor | None = None) -> GrowthResult:
        """:meth:`Strategy.grow` with the choice of ``X``'s regime; see the class docstring for what it records."""
        if not isinstance(X, Tensor) or X.dim() < 1:
            raise ValueError("X must be a tensor (b, d_s, d_e)")
        chosen = self.choice(X.device, int(X.shape[-1]))  # default.json is read once per growth
        strategy = self._built_for(chosen)
        if stats is not None and type(stats) is not type(strategy.new_statistics()):
            raise ValueError(
                f"stats of type {type(stats).__name__} do not fit the default for {chosen.regime.describe()}, "
                f"{chosen.spec}: build them with strategies.make(strategies.default_spec(device=..., d_e=...))"
                ".new_statistics()")
        result = strategy.grow(W_Q, W_K, X, G, p, loss_of_scores, scale=scale, new_scale=new_scale, mask=mask,
                               stats=stats, scores=scores, loss_before=loss_before)
        info = result.info
        info["default_regime"] = chosen.regime.key
        info["default_evidence"] = chosen.evidence()
        info["statistics_needed"] = {"batches": chosen.batches, "tokens_per_d_e2": chosen.tokens_per_entry}
        if chosen.note:
            result.fallback.append(f"default: {chosen.note}")
        if not chosen.generalises:
            # The statement itself says which strategy ran and why (the one that harms least, or the rule's choice
            # where growth works, shown harmless elsewhere): its own field, not repeated here.
            result.fallback.append(
                f"default: growth does not generalise in {(chosen.source or chosen.regime).describe()} on some of "
                f"its data, by the evidence of {DEFAULT_FILE}; ran {chosen.spec} (info['default_evidence'] says where "
                "and why)")
        short = _fewer_statistics(chosen, info)
        if short:
            result.fallback.append(short)
        return result

    # grow and direction delegate whole; these keep the abstract interface honest for callers of the parts.
    def _direction(self, stats: Statistics, log: list[str], info: dict) -> Tensor:
        return self._for(stats.sum_A)._direction(stats, log, info)

    def _step(self, ctx: StepContext, W_Q: Tensor, W_K: Tensor, stats: Statistics, p: int):
        return self._for(ctx.X)._step(ctx, W_Q, W_K, stats, p)
