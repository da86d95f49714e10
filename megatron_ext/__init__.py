"""Megatron-Core extension: position strategies (positions/) and the RoPE hook that carries them in."""

from megatron_ext import import_shims as _import_shims

# Before anything imports megatron.core (import_shims says why; it imports no torch).
_import_shims.install()
