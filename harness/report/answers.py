"""The report's first screen: one plain answer per kind of data the sweep ran. Grow or not, by how much, how sure.

The kinds are the datasets' own (``Dataset.kind``): synthetic tasks, small models on natural data, and a real
pretrained model, answered per model and task (``Dataset.task``: head recovery, its own objective), since a
model's tasks can disagree. Every number is the rule's own (:mod:`harness.rule.choice`): the held-out gain of
the regime's default on each dataset, its mean over seeds with the 95 % Student-t interval, as the
recommendation's evidence records it. Nothing is pooled across datasets: a gain of 51 % on one synthetic task
and of 0.6 % within noise on another are both said.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import pandas as pd

from growbench.datasets.registry import DATASETS
from growbench.harness.report.sections import Block, Bullet, Bullets, Link, Paragraph, Section, Span
from growbench.harness.report.wording import listing, plural
from growbench.harness.rule.choice import recommend
from growbench.harness.rule.reference import dataset_name, run_regimes
from growbench.strategies.regimes import Regime

TITLE = "Should you grow? One answer per kind of data"
ANCHOR = "answers"
#: The kinds in the order they are answered, with how a reader calls them.
KIND_LABELS = {"synthetic": "Synthetic tasks", "natural": "Small models on natural data", "pretrained": "Pretrained"}
OTHER = "other"
#: Verdicts, from what the intervals show on the datasets of one kind.
GROW, GROW_WHERE_SHOWN, NO_EVIDENCE, DO_NOT_GROW = ("grow", "grow only where shown", "no evidence that growth helps",
                                                    "do not grow")


class Evidenced(Protocol):
    """What an answer reads of a regime's recommendation (:class:`harness.rule.choice.Recommendation`, or the
    same fields read back from ``recommendation.json``)."""

    regime: str | None
    spec: str | None
    evidence: dict


@dataclass(frozen=True)
class Claim:
    """The default's held-out gain on one dataset: its mean over seeds and 95 % interval, as shares of the loss."""

    dataset: str
    regime: str
    spec: str
    mean: float
    low: float
    high: float
    seeds: int

    @property
    def lowers(self) -> bool:
        """The interval lies above 0: it lowers the held-out loss beyond seed noise."""
        return self.seeds > 1 and self.low > 0

    @property
    def raises(self) -> bool:
        """The interval lies below 0: it raises the held-out loss beyond seed noise."""
        return self.seeds > 1 and self.high < 0

    def numbers(self) -> str:
        """The mean and its 95 % interval in % of the held-out loss, with the seeds: ``+0.62% [-0.37, +1.6] over 8
        seeds``; a gain shown above 0 reads without signs, after "by": ``51.4% [50.9, 52] over 8 seeds``."""
        fmt = ".3g" if self.lowers else "+.3g"
        if self.seeds < 2:
            return f"{100 * self.mean:{fmt}}% (1 seed, no interval)"
        return (f"{100 * self.mean:{fmt}}% [{100 * self.low:{fmt}}, {100 * self.high:{fmt}}] over "
                f"{plural(self.seeds, 'seed')}")


@dataclass(frozen=True)
class Answer:
    """One kind of data (a pretrained model's task counts as its own kind): the verdict and its claims."""

    kind: str
    label: str
    claims: tuple[Claim, ...]

    @property
    def verdict(self) -> str:
        """:data:`GROW` when the default lowers the held-out loss beyond noise on every dataset of the kind,
        :data:`DO_NOT_GROW` when it raises it beyond noise on one, :data:`NO_EVIDENCE` when every interval spans 0,
        else :data:`GROW_WHERE_SHOWN`."""
        if any(c.raises for c in self.claims):
            return DO_NOT_GROW
        if all(c.lowers for c in self.claims):
            return GROW
        return GROW_WHERE_SHOWN if any(c.lowers for c in self.claims) else NO_EVIDENCE

    @property
    def regimes(self) -> list[str]:
        """The regimes (keys) of the claims, in order."""
        return list(dict.fromkeys(c.regime for c in self.claims))

    def text(self) -> str:
        """The answer after its label and verdict, in one or two sentences."""
        named = len(self.regimes) > 1  # each dataset names its regime when the kind spans several

        def where(c: Claim) -> str:
            return f"{c.dataset}" + (f" ({Regime.parse(c.regime).describe()})" if named else "")

        lowered = [c for c in self.claims if c.lowers]
        raised = [c for c in self.claims if c.raises]
        noise = [c for c in self.claims if not c.lowers and not c.raises]
        parts = []
        if lowered:
            every = " on every dataset of this kind" if len(lowered) == len(self.claims) and len(lowered) > 1 else ""
            parts.append("the default lowers the held-out loss" + every + ": "
                         + "; ".join(f"{where(c)} by {c.numbers()}" for c in lowered))
        if raised:
            parts.append("it raises the held-out loss beyond seed noise on "
                         + "; ".join(f"{where(c)} (gain {c.numbers()})" for c in raised))
        if noise:
            parts.append(("no evidence it helps on " if lowered or raised else
                          "its held-out gain is within seed noise on ")
                         + "; ".join(f"{where(c)} ({c.numbers()})" for c in noise))
        text = ". On the other hand, ".join(parts) if raised and lowered else "; ".join(parts)
        return text[0].upper() + text[1:] + "."


def dataset_kind(problem: str) -> tuple[str, str]:
    """``(kind, label)`` of a dataset of the evidence (``"minilm-recovery:layer=4:head=7"``, ``"teacher @ d_e=768"``).

    A pretrained model's dataset is labelled by its model and task (``Pretrained MiniLM, head recovery``); a
    dataset this process does not know (a plugin's, one since removed) is :data:`OTHER`.
    """
    # The registry name is what comes before the options; a stored name need not parse (a hand-made database's
    # "=HYPERLINK(...)" is a dataset of its own kind, not an error of the report).
    name = dataset_name(problem).split(":", 1)[0]
    cls = DATASETS.get(name)
    kind = getattr(cls, "kind", None)
    if kind not in KIND_LABELS:
        return OTHER, "Other data"
    if kind != "pretrained":
        return kind, KIND_LABELS[kind]
    # The model from the class, else from the dataset family's prefix ("smollm-lm" -> "smollm").
    model = getattr(cls, "model_name", None) or name.split("-", 1)[0]
    task = getattr(cls, "task", None) or "its own task"
    return f"pretrained:{model}:{task}", f"{KIND_LABELS['pretrained']} {model}, {task}"


def plain_answers(recs: Mapping[str, Evidenced]) -> list[Answer]:
    """One :class:`Answer` per kind of data in the recommendations' evidence, in :data:`KIND_LABELS` order.

    Parameters
    ----------
    recs : mapping of str to Recommendation
        ``{regime key: recommendation}``; only its ``spec`` and its evidence per dataset are read.

    Returns
    -------
    list of Answer
        Synthetic first, then natural, then each pretrained (model, task) as met, then other data; empty when no
        regime has a choice.
    """
    groups: dict[str, tuple[str, list[Claim]]] = {}
    for key, rec in recs.items():
        if rec.spec is None:
            continue
        for ds, e in rec.evidence.items():
            if not isinstance(e, dict) or "heldout_gain" not in e:
                continue  # the summaries over datasets (median_time_ms, ...) sit beside the datasets
            mean, low, high, n = e["heldout_gain"]
            if mean is None:
                continue
            kind, label = dataset_kind(ds)
            claim = Claim(ds, rec.regime or key, rec.spec, mean, math.nan if low is None else low,
                          math.nan if high is None else high, int(n))
            groups.setdefault(kind, (label, []))[1].append(claim)
    order = [*KIND_LABELS, *(k for k in groups if k.startswith("pretrained:")), OTHER]  # models and tasks as met
    return [Answer(kind, groups[kind][0], tuple(groups[kind][1])) for kind in dict.fromkeys(order) if kind in groups]


@dataclass(frozen=True)
class ArchitectureChoice:
    """The rule applied to one pretrained model's datasets of a regime alone."""

    model: str
    tasks: tuple[str, ...]
    spec: str | None
    verdict: str | None


def by_architecture(frame: pd.DataFrame | None, recs: Mapping[str, Evidenced]) -> dict[str, list[ArchitectureChoice]]:
    """Per regime whose datasets come from several pretrained models (architectures), the rule's choice on each
    model's datasets alone: whether the architectures agree is a finding the regime's one choice would hide."""
    out: dict[str, list[ArchitectureChoice]] = {}
    if frame is None or frame.empty:
        return out
    regimes = run_regimes(frame)
    for key, rec in recs.items():
        if rec.spec is None:
            continue
        models: dict[str, tuple[set[str], list[str]]] = {}
        for ds in rec.evidence:
            kind, _ = dataset_kind(ds)
            if kind.startswith("pretrained:"):
                _, model, task = kind.split(":", 2)
                names, tasks = models.setdefault(model, (set(), []))
                names.add(dataset_name(ds))
                tasks.append(task)
        if len(models) < 2:
            continue
        runs = frame[regimes == key]
        choices = []
        for model, (names, tasks) in models.items():
            try:
                alone = recommend(runs[runs.dataset.isin(names)], regime=key)
            except ValueError:
                alone = None
            choices.append(ArchitectureChoice(model, tuple(dict.fromkeys(tasks)), getattr(alone, "spec", None),
                                              getattr(alone, "verdict", None)))
        out[key] = choices
    return out


def architecture_bullets(choices: dict[str, list[ArchitectureChoice]], recs: Mapping[str, Evidenced]) -> list[Bullet]:
    """One bullet per regime of :func:`by_architecture`: each model's choice, and whether they agree."""
    items = []
    for key, per_model in choices.items():
        said = "; ".join(f"on {c.model}'s datasets alone ({', '.join(c.tasks)}), {c.spec or 'nothing'}"
                         + (f" ({c.verdict})" if c.verdict else "") for c in per_model)
        specs, chosen = {c.spec for c in per_model}, recs[key].spec
        owners = [c.model for c in per_model if c.spec == chosen]
        if len(specs) == 1:
            agree = f"The architectures agree: {chosen} serves both."
        else:
            whose = (f"is {listing(owners)}'s choice, not {listing([c.model for c in per_model if c.spec != chosen])}'s"
                     if owners else "is not what either would choose alone")
            agree = (f"The architectures disagree: the regime's one choice, {chosen}, {whose} (the regime has no "
                     "architecture axis: see docs/results.md).")
        items.append(Bullet((Span(f"By architecture ({Regime.parse(key).describe()})", "strong"), ": the rule "
                             f"chooses, {said}. {agree}")))
    return items


def answers_section(recs: Mapping[str, Evidenced], frame: pd.DataFrame | None = None) -> Section | None:
    """The report's first section: :func:`plain_answers` as one bullet each, and where a regime holds several
    pretrained architectures, the rule's choice on each alone (:func:`by_architecture`); None without a
    recommendation."""
    answers = plain_answers(recs)
    if not answers:
        return None
    items = []
    for a in answers:
        regimes = listing([Regime.parse(r).describe() for r in a.regimes])
        items.append(Bullet((Span(a.label, "strong"), f" ({', '.join(sorted({c.dataset for c in a.claims}))}; "
                             f"{regimes}): ", Span(a.verdict, "strong"), ". ", a.text())))
    items += architecture_bullets(by_architecture(frame, recs), recs)
    intro: list[Block] = [Paragraph.of(
        "What one growth with the default does to the loss on test batches it never saw: its held-out gain (the "
        "held-out loss decrease as a share of the held-out loss), the mean over seeds with its 95% interval, per "
        "dataset. Beyond noise means the whole interval is above 0. How the default is chosen: ",
        Link("What to use", "what-to-use", "What to use"), ".")]
    return Section(TITLE, [*intro, Bullets(items)], anchor=ANCHOR)
