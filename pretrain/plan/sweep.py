"""`pretrain plan --sweep`: every size × method of table.py on one cluster, GPU-hours per run and total."""

from __future__ import annotations

import argparse

from pretrain.plan.report import duration, gib


def sweep(args: argparse.Namespace) -> str:
    """The sweep table as text (each run on its launcher's resources unless --nodes/--gpus-per-node)."""
    from pretrain.plan.layout import overrides, plan_for
    from pretrain.table import SHIPPED_METHODS, TABLE1_SIZES
    from pretrain.trainer.config import CONFIG_DIR, load

    from pretrain.plan.budget import budget_tokens, gpu_hours_at

    width = max(len(f"{size}_{method}") for size in TABLE1_SIZES for method in SHIPPED_METHODS) + 2
    rows = [f"{'run':<{width}}{'GPUs':>6}{'TP/PP/DP':>10}{'peak/GPU':>13}{'fits':>6}{'steps':>8}{'wall':>13}"
            f"{'GPU-h':>10}{'GPU-h chinchilla':>18}"]
    total = chinchilla = 0.0
    gpu_label = None
    for size in TABLE1_SIZES:
        for method in SHIPPED_METHODS:
            # the shipped configs are generated from table.py (a test keeps them equal to it)
            config = load(CONFIG_DIR / f"{size}_{method}.yaml", overrides(args))
            plan = plan_for(config, args)
            lay = plan.layout
            gpu_label = plan.gpu_label
            total += plan.gpu_hours
            at_chinchilla = gpu_hours_at(plan, budget_tokens(size, "chinchilla"))
            chinchilla += at_chinchilla
            rows.append(f"{size + '_' + method:<{width}}{lay.world:>6}{f'{lay.tp}/{lay.pp}/{lay.dp}':>10}"
                        f"{gib(plan.worst.peak):>13}{'yes' if plan.fits else 'NO':>6}{plan.iterations:>8,}"
                        f"{duration(plan.wall_seconds):>13}{plan.gpu_hours:>10,.1f}{at_chinchilla:>18,.1f}")
    rows.append(f"{'total':<{width}}{'':>66}{total:>10,.1f}{chinchilla:>18,.1f}")
    mfu = (f"MFU {args.mfu:.0%} (--mfu)" if args.mfu else "each size's measured MFU where one is stored "
           "(pretrain/plan/measured.py), else the GPU's published Megatron MFU (pretrain/plan/hardware.py)")
    return "\n".join([f"sweep: Table 1 sizes x shipped methods on {gpu_label}, {mfu}", *rows,
                      "GPU-h: the config's budget (the paper's Table 1); GPU-h chinchilla: 20 tokens per parameter "
                      "(plan --budget chinchilla, BUDGET=chinchilla for the launchers)",
                      "one seed per run; the paper's 3 seeds (sbatch --array=0-2) triple the total"])
