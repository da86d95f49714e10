"""Which exports the installed transformers can run, found by feature detection rather than by version strings.

Private transformers API: reads `transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS` (the rope-type table that
LlamaRotaryEmbedding looks `rope_type` up in; not exported at the package top level), because a missing type
fails only at model construction with a bare KeyError. Checked: no "proportional" in 4.57.1, 5.0.0, 5.4.0; present
in 5.5.0 and 5.24.0.

p-RoPE exports as Llama with rope_type "proportional" (pretrain.hf.rope), first in transformers 5.5.0
(PROPORTIONAL_ROPE_SINCE). The other exports (Llama, Qwen2, and Llama 4 text for NoPE-interleaved models) run on the
`hf` extra's floor, 4.57.
"""

from __future__ import annotations

from typing import Iterable

__all__ = ["PROPORTIONAL_ROPE_SINCE", "check_proportional_rope", "installed_transformers", "rope_types"]

PROPORTIONAL_ROPE_SINCE = "5.5"


def rope_types() -> frozenset[str]:
    """The rope_type values the installed transformers builds (empty when transformers is not installed)."""
    try:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    except ImportError:
        return frozenset()
    return frozenset(ROPE_INIT_FUNCTIONS)


def installed_transformers() -> str:
    """'transformers X.Y.Z' as imported (or 'no transformers'), for messages."""
    try:
        import transformers
    except ImportError:
        return "no transformers installed"
    return f"transformers {transformers.__version__}"


def check_proportional_rope(proportion: float, available: Iterable[str] | None = None) -> None:
    """ValueError (one line: the method, the installed version, the one to install) unless transformers has
    rope_type "proportional"; `available` defaults to rope_types()."""
    if "proportional" in (rope_types() if available is None else frozenset(available)):
        return
    raise ValueError(f"cannot export: p-RoPE (model.rope_proportion={proportion:g}) exports as transformers' "
                     f"rope_type 'proportional', which {installed_transformers()} lacks (it arrived in "
                     f"{PROPORTIONAL_ROPE_SINCE}); pip install 'transformers>={PROPORTIONAL_ROPE_SINCE}', or score "
                     "it with --backend megatron")
