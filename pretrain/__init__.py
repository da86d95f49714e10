"""Training entry, configs, evaluation and export for RoPE position augmentation on Megatron-Core."""
