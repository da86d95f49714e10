"""Token budgets a Table 1 size can train: the paper's Table 1 budget (the shipped configs) or Chinchilla's.

`chinchilla` is 20 training tokens per parameter (Hoffmann et al. 2022, "Training Compute-Optimal Large
Language Models"), of Table 1's non-embedding parameter count. The switch is one name everywhere:
`plan --budget`, `reproduce --slurm --budget`, and `BUDGET=` for the launchers; each becomes the one
override `schedule.train_tokens=<tokens>`.
"""

from __future__ import annotations

import math

from pretrain.table import SIZES

CHINCHILLA_TOKENS_PER_PARAM = 20
BUDGETS = {"table1": "the paper's Table 1 tokens (what the shipped configs train)",
           "chinchilla": f"{CHINCHILLA_TOKENS_PER_PARAM} tokens per (Table 1, non-embedding) parameter"}


def budget_tokens(size: str, budget: str) -> int:
    """Training tokens of `size` under `budget`; ValueError naming the choices otherwise."""
    if budget not in BUDGETS:
        raise ValueError(f"budget {budget!r}: choose from {', '.join(BUDGETS)}")
    row = SIZES.get(size)
    if row is None or not row.is_paper_size:
        paper = [name for name, s in SIZES.items() if s.is_paper_size]
        raise ValueError(f"budget {budget}: size {size!r} is not a Table 1 size ({', '.join(paper)})")
    if budget == "table1":
        return row.train_tokens
    return int(round(CHINCHILLA_TOKENS_PER_PARAM * row.table1_params))


def budget_override(size: str, budget: str | None) -> list[str]:
    """The `--set` string a budget stands for ([] for None: the config's own train_tokens)."""
    return [] if budget is None else [f"schedule.train_tokens={budget_tokens(size, budget)}"]


def gpu_hours_at(plan, tokens: int) -> float:
    """The plan's GPU-hours rescaled to `tokens` (same step time; whole steps)."""
    return plan.gpu_hours * math.ceil(tokens / plan.tokens_per_step) / plan.iterations
