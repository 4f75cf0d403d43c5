"""asv benchmark suites of growbench (see ``asv.conf.json``; ``benchmarks/micro`` holds pytest-benchmark ones).

Every suite imports the project lazily, in ``setup``: a commit that lacks a module
skips the benchmark (``NotImplementedError``) instead of breaking ``asv run`` over
history.
"""
