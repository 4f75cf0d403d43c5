"""The rule that picks the default per regime, in parts: each module one step (:mod:`harness.recommend` is the index).

``parameters`` (tolerances and names), ``loading`` (the runs of a database), ``reference`` (each dataset's reference
configuration, the regime of a run, the per-run measures), ``paired`` (means over seeds and their intervals),
``wording`` (the rule and the verdicts in words), ``choice`` (the rule itself), ``console`` (what
``growbench recommend`` prints) and ``default_file`` (writing ``strategies/default.json``).
"""
