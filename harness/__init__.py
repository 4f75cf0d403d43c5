"""Harness: model, sweep runner, timing, CLI."""
