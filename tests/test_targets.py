"""The sketch study of ``growbench targets``: randomised SVDs against a full SVD on the scale set."""

from __future__ import annotations

import pytest

from growbench.harness.targets import sketch_rows, sketch_verdicts


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    # A sketch as wide as the matrix (256 columns at d_e = 256) spans its whole range: the same
    # truncation as the full SVD, so the same step; the truncation's own sketch is measured beside it.
    return sketch_rows("cpu", str(tmp_path_factory.mktemp("cache")), widths=[256], sketches=((256, 0), (16, 4)))


def test_a_sketch_spanning_the_whole_space_takes_the_full_svd_step(rows):
    g = rows.set_index("sketch")
    assert list(g.index) == ["full SVD", "rsvd 256/0", "rsvd 16/4"]
    assert g.loc["full SVD", "loss"] == 0.0
    assert g.loc["rsvd 256/0", "optimality"] == pytest.approx(g.loc["full SVD", "optimality"], abs=1e-4)
    assert (rows.t_truncation_ms > 0).all()


def test_the_verdict_names_the_truncations_own_sketch(rows):
    (line,) = sketch_verdicts(rows, "cpu")
    g = rows.set_index("sketch")
    met = "yes" if g.loc["rsvd 16/4", "loss"] <= 0.01 else "no"
    assert line.startswith("| cpu d_e=256: rsvd 16/4 step optimality within 1% of a full SVD's |")
    assert line.endswith(f"| {met} |")
