"""One loss evaluation of the reference problem (the unit of a line search's cost, docs/mathematics.md §5)."""

import torch


def test_loss_of_scores(benchmark, reference):
    S = reference.X @ (reference.scale * reference.W_Q @ reference.W_K.mT) @ reference.X.mT
    benchmark.group = "loss_of_scores"

    def once():
        with torch.no_grad():
            return float(reference.loss_of_scores(S))

    assert benchmark(once) > 0


def test_loss_of_scores_grad(benchmark, reference):
    """With the backward pass to ``S`` (what the Newton search pays per AD pass, roughly)."""
    S = (reference.X @ (reference.scale * reference.W_Q @ reference.W_K.mT) @ reference.X.mT).requires_grad_(True)
    benchmark.group = "loss_of_scores"

    def once():
        (g,) = torch.autograd.grad(reference.loss_of_scores(S), S)
        return g

    assert benchmark(once).shape == S.shape
