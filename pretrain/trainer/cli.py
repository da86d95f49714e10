"""`python -m pretrain train`: the command line of training (parsed before torch or Megatron is imported)."""

from __future__ import annotations

import os
import sys

from pretrain.cli import Parser, add_config, add_set, config_of


def parser() -> Parser:
    """The train command's arguments."""
    p = Parser(prog="python -m pretrain train", description="Train a RoPE GPT on Megatron-Core with a position "
               "strategy.")
    add_config(p)
    add_set(p, dest="overrides", help="override a config field")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    return p


def main(argv: list[str]) -> int:
    """CLI for `python -m pretrain train`: bad input is one line and exit code 2."""
    args = parser().parse_args(argv)
    try:
        path = config_of(args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    from pretrain.trainer import config as config_module
    from pretrain.trainer.loop import run_cli

    try:
        config = config_module.load(path, args.overrides)
        if args.print_config:
            print(config_module.dump(config))
            print(f"iterations: {config.train_iters()} ({config.train_tokens():,} tokens)")
            return 0
        config.validate(int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return run_cli(config)
