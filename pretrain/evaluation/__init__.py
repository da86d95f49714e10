"""Evaluation of RoPE position strategies: per-position loss, cliff, G(C), passkey, entropy, reports.

    scorer = load_scorer("runs/posaug_s42")                 # Megatron checkpoint -> HF (SDPA)
    spans = eval_spans(load_stream("data/owt"), 20, 8192)   # offsets 0, L, 2L, ...
    losses = per_position_loss(scorer, spans)               # [20, 8191]
    cliff(losses, scorer.train_window)["cliff"]

The names below load on first use (PEP 562), so that `python -m pretrain eval --help` imports no torch
(`hf_rope` names the submodule pretrain.evaluation.hf_rope).
"""

# name -> the submodule that defines it
_EXPORTS = {
    "eval_cli": "cli", "evaluate": "record",
    **dict.fromkeys(("TokenStream", "eval_spans", "load_stream"), "data"),
    **dict.fromkeys(("GAIN_METHODS", "attention_entropy_ratio", "cliff", "context_gain",
                     "exact_window_losses", "in_distribution_penalty", "kv_cache_window_losses",
                     "per_position_loss"), "metrics"),
    **dict.fromkeys(("RetrievalExample", "extract_answer", "greedy_decode", "passkey", "passkey_examples",
                     "retrieval_accuracy", "ruler_niah", "ruler_niah_examples", "score_answer"), "passkey"),
    **dict.fromkeys(("aggregate", "default_label", "load_records", "markdown_table", "plot_cliff_vs_size",
                     "plot_context_gain", "plot_loss_curves", "record_metrics", "write_csv", "write_record"), "report"),
    "cliff_in_start": "ranges",
    **dict.fromkeys(("HFScorer", "MegatronScorer", "RunInfo", "Scorer"), "scorers"),
    **dict.fromkeys(("BACKENDS", "load_scorer"), "scorer_loading"),
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    """A public name of the package, imported from its submodule on first use."""
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
