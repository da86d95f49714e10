"""Hugging Face interop: weight-name map, tokenizer conversion, RoPE mapping, export, import."""
