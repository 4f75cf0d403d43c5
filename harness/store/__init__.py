"""Result stores: the SQLite files of growth runs and of training runs, and their loaders.

Lowest first: :mod:`~harness.store.schema` (the tables), :mod:`~harness.store.dbfile`
(checking and marking a file), :mod:`~harness.store.base` (:class:`~harness.store.base.RunStore`,
the writer every kind of run shares, and :func:`~harness.store.base.read_tables`), then one
module per kind of run: :mod:`~harness.store.results` (growth runs) and
:mod:`~harness.store.training` (training runs and their curves).
"""
