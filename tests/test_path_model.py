"""The bracket search's local model of the loss along λ against paths whose minimiser is known in closed form."""

import math

import numpy as np
import pytest

from growbench.strategies.path_model import LocalModel


@pytest.mark.parametrize("a, c", [(0.5, 0.0), (0.2, 0.05), (1.0, -0.01)])
def test_the_cubic_through_phi0_and_its_slope_is_exact_on_a_cubic_path(a, c):
    """φ(λ) = 1 − λ + a λ² + c λ³: two trials and (φ(0), φ'(0)) fix it, so the model's minimiser is the path's,
    the root of 3cλ² + 2aλ − 1 where the curvature is positive."""
    def phi(x):
        return 1 - x + a * x**2 + c * x**3

    roots = [r.real for r in np.roots([3 * c, 2 * a, -1]) if abs(r.imag) < 1e-12 and r.real > 0
             and 2 * a + 6 * c * r.real > 0] if c else [1 / (2 * a)]
    lam_star = min(roots)
    trials = {0.5 * lam_star: phi(0.5 * lam_star), 2 * lam_star: phi(2 * lam_star)}
    model = LocalModel(trials, 1.0, -1.0)
    lam, value = model.argmin()
    assert lam == pytest.approx(lam_star, rel=1e-9)
    assert value == pytest.approx(phi(lam_star), rel=1e-9)
    assert model(3.3 * lam_star) == pytest.approx(phi(3.3 * lam_star), rel=1e-9)


def test_one_trial_gives_the_quadratic_model():
    """With a single trial the cubic term is 0: the quadratic through φ(0), φ'(0), φ(λ_1), minimised at −φ'(0)/κ."""
    f0, g0, lam1, v1 = 2.0, -0.4, 1.0, 1.8
    kappa = 2 * (v1 - f0 - g0 * lam1) / lam1**2
    lam, _ = LocalModel({lam1: v1}, f0, g0).argmin()
    assert lam == pytest.approx(-g0 / kappa)


@pytest.mark.parametrize("m", [0.01, 3.0, 500.0])
def test_inside_a_bracket_a_cliff_beyond_the_minimum_does_not_enter_the_fit(m):
    """Inside a bracket the model rests on the best trial, its neighbour towards λ = 0, φ(0) and φ'(0): on the
    cubic path φ = 1 − λ/m + (λ/m)³/3 it finds the minimiser ``m`` exactly, whatever the trial beyond it (a cliff,
    here 10⁶, or an overflow), which only bounds the bracket."""
    def phi(x):
        return 1 - x / m + (x / m) ** 3 / 3

    for beyond in (1e6, math.inf):
        trials = {0.4 * m: phi(0.4 * m), 1.3 * m: phi(1.3 * m), 4 * m: beyond}
        model = LocalModel(trials, 1.0, -1.0 / m)
        assert model.neighbours == (0.4 * m, 4 * m) and model.range == (0.4 * m, 4 * m)
        lam, value = model.argmin()
        assert lam == pytest.approx(m, rel=1e-9) and value == pytest.approx(phi(m), rel=1e-9)


def test_a_best_trial_at_the_top_looks_a_decade_beyond_it():
    """A path still falling at the largest trial: the model's range reaches 10 times past it, no further."""
    trials = {1.0: 0.9, 2.0: 0.8}
    model = LocalModel(trials, 1.0, -0.1)  # φ = 1 − λ/10 exactly: linear, its minimum is where the range ends
    assert model.neighbours == (1.0, math.inf)
    lam, value = model.argmin()
    assert lam == pytest.approx(20.0) and value == pytest.approx(-1.0)


def test_an_infinite_trial_leaves_the_model_unfitted():
    """A trial past an overflow (φ = inf) cannot be fitted: the model says so and offers the best trial itself."""
    model = LocalModel({1.0: 0.5, 2.0: math.inf}, 1.0, -1.0)
    assert not model.fitted and math.isnan(model(1.5))
    assert model.argmin() == (1.0, 0.5)
