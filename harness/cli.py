"""The ``growbench`` command line."""

from __future__ import annotations

import argparse
import json
import sys

import strategies


def _cmd_list(args: argparse.Namespace) -> int:
    data = {"presets": strategies.presets(), "specs": strategies.specs()}
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print("presets:")
        for name, spec in data["presets"].items():
            print(f"  {name:10s} {spec}")
        print(f"specs: {len(data['specs'])} (growbench list --json prints them all)")
    return 0


def _cmd_example(args: argparse.Namespace) -> int:
    import pandas as pd

    from .example import run_example

    names = args.presets.split(",") if args.presets else None
    for n in names or []:
        strategies.parse(n)  # unknown names fail before any work, with the valid list
    df = run_example(b=args.b, d_s=args.d_s, d_e=args.d_e, d_k=args.d_k, p=args.p, cond=args.cond,
                     repeats=args.repeats, seed=args.seed, device=args.device, names=names)
    print("problem:", ", ".join(f"{k}={v}" for k, v in df.attrs["problem"].items()))
    print(f"bottleneck ‖ΠG‖/‖G‖ = {df.attrs['bottleneck']:.4f}")
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_colwidth", 60):
        print(df.drop(columns=["fallback"]).to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    for _, row in df[df.fallback != ""].iterrows():
        print(f"fallback in {row.preset}: {row.fallback}")
    if args.json:
        df.to_json(args.json, orient="records", indent=2)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``growbench``."""
    parser = argparse.ArgumentParser(prog="growbench", description="Benchmark strategies that grow attention's d_k.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_list = sub.add_parser("list", help="list presets and strategy specs")
    p_list.add_argument("--json", action="store_true", help="machine-readable output")
    p_list.set_defaults(func=_cmd_list)
    p_ex = sub.add_parser("example", help="grow the reference block once with every preset and print a table")
    p_ex.add_argument("--b", type=int, default=256, help="batch size (default 256)")
    p_ex.add_argument("--d-s", type=int, default=128, help="sequence length (default 128)")
    p_ex.add_argument("--d-e", type=int, default=64, help="embedding width (default 64)")
    p_ex.add_argument("--d-k", type=int, default=8, help="student's query/key width (default 8)")
    p_ex.add_argument("--p", type=int, default=8, help="columns to add (default 8)")
    p_ex.add_argument("--cond", type=float, default=100.0, help="condition number of the input covariance")
    p_ex.add_argument("--repeats", type=int, default=5, help="timed repeats after one warm-up (median reported)")
    p_ex.add_argument("--seed", type=int, default=0)
    p_ex.add_argument("--device", default="cpu", help="cpu or cuda")
    p_ex.add_argument("--presets", default="", help="comma-separated preset names or specs (default: every preset)")
    p_ex.add_argument("--json", default="", help="also write the table to this JSON file")
    p_ex.set_defaults(func=_cmd_example)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``growbench`` console script."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:
        print(f"growbench: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
