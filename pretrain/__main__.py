"""`python -m pretrain <command>`: train, eval, runs, export-hf, export-gguf, import-hf, demo, reproduce, selfcheck, plan."""

from __future__ import annotations

import sys

# command -> (module, function, one-line help). Modules are imported only for the command that runs, so
# `python -m pretrain --help` imports nothing heavy; each command parses its arguments before importing torch.
COMMANDS = {
    "train": ("pretrain.trainer.cli", "main", "train a model (config by name or YAML path, + --set overrides)"),
    "demo": ("pretrain.experiments.demo", "main", "the embedded CPU demo: baseline vs PosAug on a no-download corpus"),
    "eval": ("pretrain.evaluation", "eval_cli", "per-position loss, cliff, context gain, passkey"),
    "export-hf": ("pretrain.hf.export", "export_cli", "checkpoint -> Hugging Face Llama directory"),
    "export-gguf": ("pretrain.hf.gguf_export", "export_gguf_cli",
                    "checkpoint -> llama.cpp GGUF (llama.cpp's converter), checked against transformers"),
    "import-hf": ("pretrain.hf.importer", "import_cli", "Hugging Face Llama directory -> checkpoint"),
    "reproduce": ("pretrain.experiments.reproduce_cli", "main",
                  "paper-style comparison (--suite lm | tasks | ablations | documents; --slurm: the grid as SLURM jobs)"),
    "runs": ("pretrain.experiments.runs", "main", "list runs under a directory: size, method, seed, state"),
    "selfcheck": ("pretrain.selfcheck", "main", "first-contact check: versions, devices, a tiny training, GPU paths"),
    "plan": ("pretrain.plan.cli", "main", "memory per GPU, step time, wall clock and GPU-hours before a run starts"),
}
# command -> (module, function) of a parser built without torch: `python -m pretrain` parses with it first, so
# `--help` and a wrong invocation answer before the command's module (and torch) is imported.
LIGHT_PARSERS = {
    "eval": ("pretrain.evaluation.arguments", "eval_parser"),
    "export-hf": ("pretrain.hf.arguments", "export_parser"),
    "export-gguf": ("pretrain.hf.arguments", "export_gguf_parser"),
    "import-hf": ("pretrain.hf.arguments", "import_parser"),
}
USAGE = "usage: python -m pretrain <command> [options]   (python -m pretrain <command> --help: its options)"


def main(argv: list[str] | None = None) -> int:
    """Dispatch to a subcommand; an unknown one is refused naming the choices (exit 2)."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        lines = [f"  {name:<10} {help_}" for name, (_, _, help_) in COMMANDS.items()]
        print(f"{USAGE}\n\ncommands:\n" + "\n".join(lines))
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        from pretrain.cli import unknown_choice

        print(f"{USAGE}\nerror: {unknown_choice('command', argv[0], list(COMMANDS))}", file=sys.stderr)
        return 2
    module_name, function, _ = COMMANDS[argv[0]]
    import importlib

    if argv[0] in LIGHT_PARSERS:
        parser_module, parser_function = LIGHT_PARSERS[argv[0]]
        getattr(importlib.import_module(parser_module), parser_function)().parse_args(argv[1:])

    from pretrain.console import quiet_known_warnings

    quiet_known_warnings()  # before Megatron is imported: its warnings fire at import time
    import pretrain.tasks  # noqa: F401  registers the task data behind `data.task` with the trainer (no torch)
    import pretrain.plan.micro_batch  # noqa: F401  registers the planner behind schedule.micro_batch_size: auto

    return getattr(importlib.import_module(module_name), function)(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
