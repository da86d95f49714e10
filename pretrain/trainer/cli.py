"""`python -m pretrain train`: the command line of training (parsed before torch or Megatron is imported)."""

from __future__ import annotations

import os
import sys

from pretrain.cli import Parser, add_config, add_set, config_of
from pretrain.trainer.run_presets import RUN_PRESETS


def parser() -> Parser:
    """The train command's arguments."""
    p = Parser(prog="python -m pretrain train", description="Train a RoPE GPT on Megatron-Core with a position "
               "strategy.")
    add_config(p)
    add_set(p, dest="overrides", help="override a config field")
    p.add_argument("--preset", choices=tuple(RUN_PRESETS),
                   help="shrink the config to a CPU run: local layers, fp32, the preset's size, window, budget and "
                        "warm-up, the data's vocabulary (table: docs/config.md; --set still wins)")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--check", action="store_true",
                   help="check the config, the data (manifest, shards, tokenizer vocabulary vs model.vocab_size) "
                        "for WORLD_SIZE ranks and exit, without building the model (the launchers' pre-flight)")
    return p


def check_data(config) -> None:
    """ValueError naming the fix unless every data prefix is complete and its tokenizer fits model.vocab_size."""
    from pretrain.trainer.data_paths import check_build, parse_blend

    if config.data.synthetic:
        return
    for _, prefix in parse_blend(config.data.data_path):
        manifest = check_build(prefix, config.model.seq_length)
        if manifest.vocab_size > config.model.vocab_size:
            raise ValueError(f"data.data_path={prefix!r} was tokenized with {manifest.tokenizer_path} "
                             f"({manifest.vocab_size:,} tokens) but model.vocab_size is {config.model.vocab_size:,}: "
                             f"set model.vocab_size={manifest.vocab_size} or build the data with the model's tokenizer")


# Set by pretrain.preflight: the launchers' pre-flight on a login node (no GPU) leaves the device check to the job.
DEVICE_CHECK_IN_JOB = "POSAUG_DEVICE_CHECK_IN_JOB"


def check_device(config) -> None:
    """ValueError naming the fix when this machine cannot run the config (Transformer Engine without CUDA)."""
    from megatron_ext.model import check_runtime

    try:
        check_runtime(config.model)
    except RuntimeError as error:
        raise ValueError(str(error)) from None


def main(argv: list[str]) -> int:
    """CLI for `python -m pretrain train`: bad input is one line and exit code 2."""
    args = parser().parse_args(argv)
    try:
        path = config_of(args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    from pretrain.trainer import config as config_module
    from pretrain.trainer.data_checks import DataError

    try:
        overrides = args.overrides
        if args.preset:
            from pretrain.trainer.run_presets import preset_overrides

            overrides = preset_overrides(args.preset, path, overrides)
        config = config_module.load(path, overrides)
        if args.print_config:
            print(config_module.dump(config))
            print(f"iterations: {config.train_iters()} ({config.train_tokens():,} tokens)")
            return 0
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        config.validate(world_size)
        if os.environ.get("RANK", "0") == "0":  # at --check and at training start: values that change nothing
            from pretrain.trainer.config_no_ops import no_op_notes

            for note in no_op_notes(config.model):
                print(f"note: {note}", file=sys.stderr, flush=True)
        if not (args.check and os.environ.get(DEVICE_CHECK_IN_JOB)):
            check_device(config)
        if args.check:
            check_data(config)
            print(f"check: config, data and layout are fine for {os.environ.get('WORLD_SIZE', '1')} rank(s)")
            return 0
        from pretrain.trainer import micro_batch

        chosen = micro_batch.resolve(config, world_size)  # schedule.micro_batch_size: auto, before any process group
        if chosen is not None:
            config.validate(world_size)
            if os.environ.get("RANK", "0") == "0":
                print(chosen, flush=True)
    except (ValueError, DataError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    from pretrain.trainer.loop import run_cli

    return run_cli(config)
