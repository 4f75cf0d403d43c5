"""Runners: the grids of a sweep, its pending runs, the workers and storing each run as it finishes."""
