"""Megatron-Core extension: position strategies (positions/) and the RoPE hook that carries them in."""

from megatron_ext import cpu_compat as _cpu_compat

# Before anything imports megatron.core: 0.19+ imports triton at import time (see cpu_compat).
_cpu_compat.install_import_shims()
