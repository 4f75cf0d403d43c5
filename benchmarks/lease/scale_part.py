"""``growbench targets``' scale part on one device, one width at a time in the order given (widest first on a
lease, so that a call stopped by its limit keeps the widths that only a GPU can measure), each width's rows
written to ``OUT/scale_rows.csv`` as they come. The sketches (``targets.sketch_rows``) are left out.

``python scale_part.py cuda OUT 4096,1024,768,256,64``; ``REPEATS`` (5), ``THREADS`` (8) and ``CACHE`` (the
trained-model cache, none by default) from the environment.
"""

from __future__ import annotations

import os
import sys

import pandas as pd
import torch

from growbench.harness import targets


def main(device: str, out: str, widths: list[int]) -> None:
    torch.set_num_threads(int(os.environ.get("THREADS", "8")))
    frames = []
    for d_e in widths:
        frames.append(targets.scale_rows(device, int(os.environ.get("REPEATS", "5")), os.environ.get("CACHE"), [d_e]))
        pd.concat(frames).to_csv(f"{out}/scale_rows.csv", index=False)
        for line in targets.scale_verdicts(frames[-1], device):
            print(line, flush=True)
    table = pd.concat(frames).drop(columns=["spec", "fallback"])
    print(table.to_string(index=False, float_format=lambda x: f"{x:.4g}"), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], [int(w) for w in sys.argv[3].split(",")])
