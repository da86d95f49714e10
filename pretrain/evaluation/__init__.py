"""Evaluation of RoPE position strategies: per-position loss, cliff, G(C), passkey, entropy, reports."""
