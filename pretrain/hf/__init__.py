"""Hugging Face interop: weight-name map, tokenizer files, RoPE config mapping, export, import.

`scaled_positions_forward(model, input_ids, positions)` calls an HF model at float positions
(PosAug α·i, RFS, PI) with the attention mask that keeps transformers from reading them as
packed sequences.
"""

__all__ = ["hf_logits", "scaled_positions_forward"]


def __getattr__(name: str):
    """The inference helpers, imported on first use: importing pretrain.hf.arguments must not import torch."""
    if name in __all__:
        from pretrain.hf import inference

        return getattr(inference, name)
    raise AttributeError(f"module 'pretrain.hf' has no attribute {name!r}")
