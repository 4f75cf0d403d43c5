"""The report's figures, one module per family, each figure with a caption computed from the data.

- :mod:`.pareto`: speed against optimality, the Pareto front;
- :mod:`.ablation`: the paired effect of changing one axis;
- :mod:`.timing`: where the time goes, how it scales, CPU against GPU;
- :mod:`.formula`: formula 2's gap to formula 1;
- :mod:`.lambda_curves`: the loss along λ and the λ each search chooses;
- :mod:`.training`: held-out loss during training.

Every figure function returns a :class:`.base.FigureResult`; nothing here writes files.
"""
