"""Which scorer a source gets, and loading it: a Megatron checkpoint (run dir or iter_*) scored by the HF backend
where it exports, else by Megatron's own model; an HF model directory by the HF backend. The scorers themselves
are pretrain/evaluation/scorers.py."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from megatron_ext.positions import RopeScaling, randomized_yarn
from pretrain.evaluation.arguments import BACKENDS
from pretrain.evaluation.scorers import HFScorer, MegatronScorer, RunInfo, Scorer


def is_megatron_checkpoint(path: str | Path) -> bool:
    """True for a run directory or iter_* directory written by our trainer."""
    from pretrain.trainer import checkpoint

    try:
        checkpoint.resolve(path)
        return True
    except FileNotFoundError:
        return False


def _scaling(kind: str | None, factor: float | None, window: int) -> RopeScaling | None:
    if kind is None or kind == "none":
        if factor is not None:
            raise ValueError("--factor needs --rope-scaling pi|ntk|dynamic_ntk|yarn|llama3")
        return None
    return RopeScaling(kind=kind, factor=factor, original_max_position_embeddings=window)


def _auto_backend(model_config) -> str:
    """What backend "auto" scores a Megatron checkpoint of this model with: hf where it exports, else megatron."""
    from pretrain.hf.export import check_exportable

    try:
        check_exportable(model_config)
        return "hf"
    except ValueError:
        return "megatron"


def resolve_backend(source: str | Path, backend: str) -> str:
    """The backend load_scorer will use for `source`, read from its recorded config without loading a weight."""
    path = Path(source)
    if backend != "auto" or not is_megatron_checkpoint(path):
        return "hf" if backend == "auto" else backend
    from pretrain.trainer import config as config_module
    from pretrain.trainer.checkpoint import read_train_state

    try:
        return _auto_backend(config_module.from_dict(read_train_state(path)["config"]).model)
    except (OSError, ValueError, KeyError, TypeError):
        return "megatron"  # unreadable here, refused by load_scorer; meanwhile the larger estimate


def load_scorer(source: str | Path, *, backend: str = "auto", train_window: int | None = None,
                rope_scaling: str | None = None, factor: float | None = None, name: str | None = None,
                device: str | torch.device = "cpu", overrides: list[str] | tuple[str, ...] = ()) -> Scorer:
    """A scorer for a Megatron checkpoint (run dir or iter_*) or an HF model directory.

    backend "auto": transformers where a Megatron checkpoint's architecture exports (pretrain.hf.export's
    check_exportable), else the Megatron model itself; an HF directory is always scored by transformers.
    `overrides`: `--set` inference-time model fields of a Megatron checkpoint (inference_model.INFERENCE_FIELDS).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS} (got {backend!r})")
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(f"{source}: no such checkpoint or model directory")
    if is_megatron_checkpoint(path):
        from pretrain.trainer.checkpoint import read_train_state
        from pretrain.trainer.config import plain_fields
        from pretrain.trainer.inference_model import load_for_inference

        model, config = load_for_inference(path, overrides)
        if backend == "auto":
            backend = _auto_backend(config.model)
        window = config.model.seq_length
        if train_window is not None and train_window != window:
            raise ValueError(f"--train-window {train_window} contradicts the checkpoint's "
                             f"model.seq_length={window}; drop the flag for Megatron checkpoints")
        from pretrain.naming import method_name, size_name

        state = read_train_state(path)
        # size and method (pretrain/table.py names) let `eval report` pair a run with its baseline, as `eval all` does
        info = RunInfo(name=name or config.name, train_window=window, strategy=config.positions.strategy,
                       seed=config.seed, parameters=config.model.non_embedding_parameters(), source=str(path),
                       extra={"iteration": state.get("iteration"), "positions": plain_fields(config.positions),
                              "data_path": config.data.data_path, "consumed_samples": state.get("consumed_samples"),
                              "size": size_name(config.model),
                              "method": method_name(config.positions, window, config.model),
                              "train_iters": config.train_iters()})
        if config.positions.strategy == "drope":  # which model the weights are: RoPE (pretraining) or without it
            from megatron_ext.positions.drope import run_phase

            info.extra["phase"] = run_phase(config.positions, state.get("iteration"), config.train_iters())
            if rope_scaling not in (None, "none"):
                raise ValueError(f"--rope-scaling {rope_scaling} scales RoPE, which this DroPE run removes from every "
                                 "layer: drop --rope-scaling")
        scaling = _scaling(rope_scaling, factor, window)
        config.model.check_positions(config.positions.strategy, None if scaling is None else scaling.kind)
        if scaling is not None and config.positions.strategy == "ryarn":
            # The override replaces the run's YaRN: only YaRN at s' >= s keeps the model's own numerics.
            s = config.positions.ryarn_scale(window)
            randomized_yarn.inference_factor(s, scaling.kind, scaling.factor, kind_name="--rope-scaling",
                                             factor_name="--factor")
        if backend == "megatron":
            return MegatronScorer(model.to(device), config.model, info, positions=config.positions,
                                  rope_scaling=scaling)
        from pretrain.hf.export import megatron_to_llama

        hf = megatron_to_llama(model, config.model, vocab_size=config.model.vocab_size).to(device)
        return HFScorer(hf, info, positions=config.positions, rope_scaling=scaling)
    if overrides:
        raise ValueError(f"--set reads a Megatron checkpoint's recorded config; {source} is not one (an HF model "
                         "directory takes its settings from its config.json)")
    if backend == "megatron":
        raise ValueError(f"{source} is not a Megatron checkpoint (no latest_checkpointed_iteration.txt or "
                         "train_state.json); the megatron backend reads only our trainer's checkpoints")
    if not (path / "config.json").is_file():
        raise ValueError(f"{source}: neither a Megatron checkpoint nor an HF model directory (no config.json)")
    if train_window is None:
        raise ValueError(f"{source} is an HF model: pass --train-window (its training context length w; "
                         "cliff and entropy split positions at w)")
    from transformers import AutoModelForCausalLM

    from pretrain.hf.rope import rope_from_hf_config

    scaling = _scaling(rope_scaling, factor, train_window)
    _, shipped = rope_from_hf_config(json.loads((path / "config.json").read_text()).get)
    if scaling is not None and shipped not in ("none", "default"):
        # The override replaces the model's frequencies; it cannot compose with a scaling the model carries.
        raise ValueError(f"{source} already carries RoPE scaling {shipped!r}; an override --rope-scaling "
                         f"{scaling.kind} would replace it: drop --rope-scaling")
    try:
        hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, attn_implementation="sdpa")
    except Exception as error:  # noqa: BLE001 - re-raised with the path and the likely cause
        raise ValueError(f"{source}: transformers could not load a causal LM from it: {error}") from error
    info = RunInfo(name=name or path.name, train_window=train_window, source=str(path),
                   parameters=_hf_non_embedding(hf))
    return HFScorer(hf.to(device), info, rope_scaling=scaling)


def _hf_non_embedding(model: torch.nn.Module) -> int:
    embeddings = {id(p) for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m is not None
                  for p in m.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in embeddings)

