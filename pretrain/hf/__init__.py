"""Hugging Face interop: weight-name map, tokenizer files, RoPE config mapping, export, import.

`scaled_positions_forward(model, input_ids, positions)` calls an HF model at float positions
(PosAug α·i, RFS, PI) with the attention mask that keeps transformers from reading them as
packed sequences.
"""

from pretrain.hf.inference import hf_logits, scaled_positions_forward

__all__ = ["hf_logits", "scaled_positions_forward"]
