"""Megatron-Core extension: position strategies (positions/) and the RoPE hook that carries them in."""
