"""Evaluation of RoPE position strategies: per-position loss, cliff, G(C), passkey, entropy, reports.

    scorer = load_scorer("runs/posaug_s42")                 # Megatron checkpoint -> HF (SDPA)
    spans = eval_spans(load_stream("data/owt"), 20, 8192)   # offsets 0, L, 2L, ...
    losses = per_position_loss(scorer, spans)               # [20, 8191]
    cliff(losses, scorer.train_window)["cliff"]
"""

from .cli import eval_cli
from .record import evaluate
from .data import TokenStream, eval_spans, load_stream
from .metrics import (GAIN_METHODS, attention_entropy_ratio, cliff, context_gain, default_in_start,
                      exact_window_losses, in_distribution_penalty, kv_cache_window_losses, per_position_loss)
from .passkey import (RetrievalExample, extract_answer, greedy_decode, passkey, passkey_examples,
                      retrieval_accuracy, ruler_niah, ruler_niah_examples, score_answer)
from .report import (aggregate, default_label, load_records, markdown_table, plot_cliff_vs_size,
                     plot_context_gain, plot_loss_curves, record_metrics, write_csv, write_record)
from .scorers import BACKENDS, HFScorer, MegatronScorer, RunInfo, Scorer, hf_rope, load_scorer

__all__ = [name for name in dir() if not name.startswith("_")]
