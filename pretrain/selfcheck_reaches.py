"""`selfcheck`'s proof of every private Megatron-Core reach (megatron_ext.versions), one row per reach.

A version string proves nothing (Megatron marks each of these names `@internal_api`), so each reach is
looked up by name and then exercised on the tiny CPU model: build, one training step, a checkpoint save
and load, RoPE at float positions, a YaRN softmax scale, attention entropy and an HF export. A reach
whose lookup fails, or whose exercise raises or comes out wrong, is a FAIL row naming it.
"""

from __future__ import annotations

import tempfile
import traceback
from typing import Callable

import torch

STAGES = ("step", "checkpoint", "float positions", "softmax scale", "entropy", "export")
# Which exercise proves each reach (megatron_ext.versions.REACHES / MODEL_REACHES).
PROVEN_BY = {"write_results_queue": "checkpoint", "gpt_preprocess": "float positions",
             "cuda_rng_state": "step", "set_cuda_rng_state": "checkpoint", "causal_mask": "step",
             "softmax_causal_mask": "step", "wrapped_torch_norm": "step", "rotary_inv_freq": "float positions",
             "softmax_scale": "softmax scale", "attention_dropout": "entropy", "optimizer_step_parts": "step"}


def _logits(model, tokens: torch.Tensor, positions) -> torch.Tensor:
    with torch.no_grad():
        return model(tokens, positions, None).float()


def _exercises(model_config, batch: dict) -> dict[str, Callable[[dict], str]]:
    """The exercises in order; each takes the shared state and returns what it saw (raises on a wrong result)."""
    from megatron_ext.model import ParallelConfig, build_model
    from megatron_ext.positions import PositionConfig, RopePositions, build_sampler
    from megatron_ext.rope_hook import attention_logits_scaled
    from pretrain.trainer import checkpoint
    from pretrain.trainer.config import OptimizerSettings
    from pretrain.trainer.engine import Engine

    # the Engine moves its model to the GPU when there is one; the other exercises follow it there
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    tokens = batch["tokens"].to(device)
    steps = {}

    def step(state: dict) -> str:
        torch.manual_seed(0)
        engine = Engine(model_config, ParallelConfig(), OptimizerSettings(lr=3e-3, min_lr=3e-3,
                                                                           lr_decay_style="constant"), 1)
        sampler = build_sampler(PositionConfig(strategy="posaug"), seed=0, train_seq_len=model_config.seq_length,
                                num_layers=model_config.num_layers, rotary_dim=model_config.rotary_dim,
                                rotary_base=model_config.rotary_base, total_steps=1)
        loss = engine.train_step(iter([batch]), sampler, 0, 1, tokens.shape[0], model_config.seq_length).loss
        if not torch.isfinite(torch.tensor(loss)):
            raise AssertionError(f"non-finite loss {loss}")
        state["engine"] = engine
        return f"one step, loss {loss:.3f}"

    def save_and_load(state: dict) -> str:
        run_dir = state["tmp"]
        saved = checkpoint.save(run_dir, 1, state["engine"], {}, keep_last=1)
        record = checkpoint.load(saved, state["engine"])
        model = build_model(model_config).to(device)
        checkpoint.load_model_weights(saved, model)
        state["model"] = model.eval()
        return f"saved and loaded iteration {record['iteration']}"

    def float_positions(state: dict) -> str:
        model = state["model"]
        arange = torch.arange(tokens.shape[1], dtype=torch.float32, device=device)
        moved = (_logits(model, tokens, arange * 2.5) - _logits(model, tokens, arange)).abs().max().item()
        if moved == 0.0:
            raise AssertionError("logits at positions 2.5·i equal those at i: the float positions were ignored")
        state["positions"] = arange
        return f"positions 2.5·i move the logits by {moved:.2e}"

    def softmax_scale(state: dict) -> str:
        model, positions = state["model"], state["positions"]
        plain = _logits(model, tokens, positions)
        with attention_logits_scaled(model, 4.0):
            scaled = _logits(model, tokens, positions)
        if torch.equal(plain, scaled) or not torch.equal(plain, _logits(model, tokens, positions)):
            raise AssertionError("scaling softmax_scale did not change the logits, or was not restored")
        return "scaled and restored"

    def entropy(state: dict) -> str:
        from pretrain.evaluation.scorers import MegatronScorer, RunInfo

        scorer = MegatronScorer(state["model"], model_config, RunInfo("selfcheck", model_config.seq_length))
        values = scorer.attention_entropy(tokens[:1], RopePositions(state["positions"]))
        if not torch.isfinite(values).all() or not (values > 0).any():
            raise AssertionError(f"attention entropy {values.flatten()[:4].tolist()}")
        return f"mean entropy {values.mean().item():.3f} nats"

    def export(state: dict) -> str:
        from pretrain.hf.export import megatron_to_llama

        model = state["model"]
        hf = megatron_to_llama(model, model_config).to(device).eval()
        with torch.no_grad():
            theirs = hf(tokens).logits.float()
        ours = _logits(model, tokens, state["positions"])[..., :model_config.vocab_size]
        diff = (theirs - ours).abs().max().item()
        if diff > 1e-4:
            raise AssertionError(f"exported model's logits differ by {diff:.2e} > 1e-4")
        return f"HF export logits within {diff:.1e}"

    steps.update(zip(STAGES, (step, save_and_load, float_positions, softmax_scale, entropy, export)))
    return steps


def reach_rows(model_config, batch: dict) -> list[tuple[str, str, str]]:
    """(row name, PASS | FAIL, detail) for each exercise and each reach; never raises."""
    from megatron_ext import versions

    stage_result: dict[str, tuple[str, str]] = {}
    with tempfile.TemporaryDirectory(prefix="selfcheck-") as tmp:
        state = {"tmp": tmp}
        for stage, exercise in _exercises(model_config, batch).items():
            if any(status == "FAIL" for status, _ in stage_result.values()):
                stage_result[stage] = ("FAIL", "not run: an earlier exercise failed")
                continue
            try:
                stage_result[stage] = ("PASS", exercise(state))
            except Exception as error:  # noqa: BLE001 - a failing exercise is a FAIL row
                traceback.print_exc()
                stage_result[stage] = ("FAIL", f"{type(error).__name__}: {error}".splitlines()[0][:300])
    model_lines = versions.check_model_reaches(state["model"]) if "model" in state else {}
    rows = [(f"exercise: {stage}", *stage_result[stage]) for stage in STAGES]
    for name, stage in PROVEN_BY.items():
        if name in versions.REACHES:
            found = versions.find(name)
            missing = None if found else versions.missing_line(name)
            what = versions.REACHES[name].owner + "." + found[0] if found else ""
        else:
            missing = model_lines.get(name, "not checked: no model was built")
            what = f"{versions.MODEL_REACHES[name][1]}.{', '.join(versions.MODEL_REACHES[name][2])}"
        status, detail = stage_result[stage]
        if missing:
            rows.append((f"reach: {name}", "FAIL", missing))
        else:
            rows.append((f"reach: {name}", status, f"{what}; {stage}: {detail}"))
    return rows
