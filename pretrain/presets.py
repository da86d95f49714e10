"""The shipped run configs: Table 1 sizes × methods, with the PosAug paper's Table 16 settings.

`python -m pretrain.presets` rewrites pretrain/configs/*.yaml from the tables below; a test
keeps the checked-in files equal to them.
"""

from __future__ import annotations

from pathlib import Path

import yaml

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
WINDOW = 2048

# Table 16: lr, min lr, warmup steps, effective batch; Table 1: token budget (the paper's,
# which is the Chinchilla 20 tokens/parameter for 42m and 113m).
SIZES = {
    "10m": dict(lr=6e-4, min_lr=6e-5, warmup=500, batch=128, tokens=500_000_000, micro=16),
    "42m": dict(lr=6e-4, min_lr=6e-5, warmup=1000, batch=128, tokens=850_000_000, micro=16),
    "113m": dict(lr=3e-4, min_lr=3e-5, warmup=1000, batch=128, tokens=2_300_000_000, micro=8),
    "425m": dict(lr=2e-4, min_lr=2e-5, warmup=500, batch=32, tokens=500_000_000, micro=4),
    "1b": dict(lr=2e-4, min_lr=2e-5, warmup=500, batch=32, tokens=500_000_000, micro=2),
}
# L for RFS/RPE = 8·w, the same positional range PosAug U[1/8, 8] reaches (L_max = b·w).
METHODS = {
    "baseline": dict(strategy="none"),
    "posaug": dict(strategy="posaug", alpha_min=0.125, alpha_max=8.0, alpha_distribution="uniform"),
    "rfs": dict(strategy="rfs", max_position=8 * WINDOW),
    "rpe": dict(strategy="rpe", max_position=8 * WINDOW),
    "warp": dict(strategy="warp", p_head=0.15, p_tail=0.15, tail_function="sqrt"),
}


def config_dict(size: str, method: str) -> dict:
    """The raw config of one (size, method) run."""
    s = SIZES[size]
    return {
        "name": f"{size}_{method}",
        "seed": 42,
        "preset": size,
        "model": {"seq_length": WINDOW, "vocab_size": 50257, "transformer_impl": "transformer_engine",
                  "bf16": True},
        "parallel": {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
                     "use_distributed_optimizer": True},
        "positions": dict(METHODS[method]),
        "data": {"data_path": None},
        "optimizer": {"lr": s["lr"], "min_lr": s["min_lr"], "weight_decay": 0.1, "adam_beta1": 0.9,
                      "adam_beta2": 0.95, "clip_grad": 1.0, "lr_warmup_iters": s["warmup"],
                      "lr_decay_style": "cosine"},
        "schedule": {"micro_batch_size": s["micro"], "global_batch_size": s["batch"],
                     "train_tokens": s["tokens"]},
        "checkpoint": {"save": f"runs/{size}_{method}", "save_interval": 500, "keep_last": 3},
        "logging": {"log_interval": 10, "eval_interval": 500, "eval_iters": 10},
    }


def render(size: str, method: str) -> str:
    """YAML text of one shipped config."""
    header = (f"# {size} {method}: PosAug paper Table 1 model, Table 16 optimisation, w = {WINDOW}.\n"
              "# GPU defaults (Transformer Engine, BF16); on CPU add --set model.transformer_impl=local "
              "model.bf16=false.\n# Set data.data_path to a data_prep --output-prefix.\n")
    return header + yaml.safe_dump(config_dict(size, method), sort_keys=False)


def write_all() -> list[Path]:
    """Rewrite every shipped config file."""
    CONFIG_DIR.mkdir(exist_ok=True)
    paths = []
    for size in SIZES:
        for method in METHODS:
            path = CONFIG_DIR / f"{size}_{method}.yaml"
            path.write_text(render(size, method))
            paths.append(path)
    return paths


if __name__ == "__main__":
    for written in write_all():
        print(written)
