"""`python -m pretrain <command>`: train, eval, runs, export-hf, import-hf, demo, reproduce, selfcheck, plan."""

from __future__ import annotations

import sys

COMMANDS = {
    "train": ("pretrain.trainer.loop", "main", "train a model (YAML config + --set overrides)"),
    "demo": ("pretrain.experiments.demo", "main", "the embedded CPU demo: baseline vs PosAug on a no-download corpus"),
    "eval": ("pretrain.evaluation", "eval_cli", "per-position loss, cliff, context gain, passkey"),
    "export-hf": ("pretrain.hf.export", "export_cli", "checkpoint -> Hugging Face Llama directory"),
    "import-hf": ("pretrain.hf.importer", "import_cli", "Hugging Face Llama directory -> checkpoint"),
    "reproduce": ("pretrain.experiments.ablations", "reproduce_main",
                  "paper-style comparison at CPU scale (--suite lm | tasks | ablations | documents)"),
    "runs": ("pretrain.experiments.runs", "main", "list runs under a directory: size, method, seed, state"),
    "selfcheck": ("pretrain.selfcheck", "main", "first-contact check: versions, devices, a tiny training, GPU paths"),
    "plan": ("pretrain.plan.cli", "main", "memory per GPU, step time, wall clock and GPU-hours before a run starts"),
}


def main(argv: list[str] | None = None) -> int:
    """Dispatch to a subcommand."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        lines = [f"  {name:<10} {help_}" for name, (_, _, help_) in COMMANDS.items()]
        print("usage: python -m pretrain <command> [options]\n\ncommands:\n" + "\n".join(lines))
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module_name, function, _ = COMMANDS[argv[0]]
    if argv[0] == "reproduce" and {"--slurm", "--slurm-stage"} & set(argv):  # the grid as SLURM jobs
        module_name, function = "pretrain.experiments.slurm_grid", "main"
    import importlib

    from pretrain.console import quiet_known_warnings

    quiet_known_warnings()  # before Megatron is imported: its warnings fire at import time
    import pretrain.tasks.source  # noqa: F401  registers the task data behind `data.task` with the trainer

    return getattr(importlib.import_module(module_name), function)(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
