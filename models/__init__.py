"""Attention blocks growth runs on: the growable block of the synthetic data sets and a pretrained model's head.

Second floor: imports ``strategies`` (and torch), never ``datasets`` or ``harness``.
"""
