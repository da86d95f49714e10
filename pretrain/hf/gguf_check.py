"""A GGUF run in llama.cpp (llama-cpp-python) against its Hugging Face export run in transformers, on the same ids.

llama.cpp is asked for float32 K/V caches (its default is F16, which alone moves logits by ~1e-3) and for the
logits of every position, so the comparison sees the converter and llama.cpp's graph, nothing else.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from pretrain.hf.gguf_support import LLAMA_CPP_PYTHON, logits_tolerance

__all__ = ["check_gguf", "check_positions", "llama_cpp_model", "llama_cpp_logits", "llama_cpp_token_losses",
           "require_llama_cpp"]

_F32 = 0  # ggml_type GGML_TYPE_F32, for the K/V caches


def require_llama_cpp() -> None:
    """ImportError (one line: what to install, or --no-check) unless llama-cpp-python imports."""
    try:
        from llama_cpp import Llama  # noqa: F401  (the class: a directory named llama_cpp on sys.path imports too)
    except ImportError as error:
        raise ImportError(f"checking the GGUF needs llama-cpp-python ({error}): pip install "
                          f"'llama-cpp-python=={LLAMA_CPP_PYTHON}' (the llama-cpp extra; it builds from source, "
                          "~17 min on 2 cores), or pass --no-check") from None


def llama_cpp_model(gguf_path: str | Path, n_ctx: int):
    """A llama-cpp-python `Llama` over the GGUF: float32 K/V caches, logits of every position, quiet."""
    from llama_cpp import Llama

    return Llama(model_path=str(gguf_path), n_ctx=int(n_ctx), n_batch=min(int(n_ctx), 512), logits_all=True,
                 type_k=_F32, type_v=_F32, verbose=False, seed=0)


def llama_cpp_logits(llm, ids: list[int]) -> np.ndarray:
    """llama.cpp's logits [len(ids), vocab] of one sequence from position 0 (its cache emptied first)."""
    llm.reset()
    llm.eval(list(map(int, ids)))
    return np.array(llm.scores[:len(ids)], dtype=np.float32)


def llama_cpp_token_losses(llm, spans: torch.Tensor) -> torch.Tensor:
    """Per-position loss [n, L-1] through llama.cpp, as pretrain.evaluation.metrics.per_position_loss lays it out."""
    losses = []
    for span in spans:
        logits = torch.from_numpy(llama_cpp_logits(llm, span.tolist())[:-1])
        losses.append(torch.nn.functional.cross_entropy(logits.double(), span[1:].long(), reduction="none"))
    return torch.stack(losses).float()


def check_positions(window: int, length: int) -> list[int]:
    """Positions the check compares: inside the window, at its edge, and at 4 and 8 windows (those below length)."""
    wanted = {window // 2, window - 1, 4 * window - 1, 8 * window - 1, length - 1}
    return sorted(p for p in wanted if 0 <= p < length)


def check_gguf(hf_dir: str | Path, gguf_path: str | Path, window: int, gguf_type: str, *,
               length: int | None = None, seed: int = 0) -> dict:
    """RuntimeError (one line) unless llama.cpp's logits equal transformers' within the type's tolerance."""
    from pretrain.hf.inference import hf_logits
    from pretrain.table import EXTRAPOLATION
    from transformers import AutoModelForCausalLM

    length = int(length or EXTRAPOLATION * window)
    if length < 2:
        raise ValueError(f"--check-tokens must be >= 2 (got {length})")
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    vocab = int(hf.config.vocab_size)
    ids = torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(seed))
    positions = check_positions(window, length)
    expected = hf_logits(hf, ids)[0, positions].numpy()
    del hf
    llm = llama_cpp_model(gguf_path, length)
    try:
        got = llama_cpp_logits(llm, ids[0].tolist())[positions]
    finally:
        llm.close()  # now, not at interpreter exit (llama-cpp-python's __del__ then finds its library gone)
    per_position = np.abs(got[:, :vocab] - expected).max(axis=1)
    tolerance = logits_tolerance(gguf_type)
    worst = int(per_position.argmax())
    if not per_position[worst] <= tolerance:  # NaN fails too
        raise RuntimeError(f"the GGUF's logits differ from transformers' by {per_position[worst]:.3g} at position "
                           f"{positions[worst]} (> {tolerance:g} for {gguf_type}; window {window}): llama.cpp does "
                           "not run this export as transformers does; use export-hf")
    return {"positions": positions, "max_abs_diff": float(per_position.max()), "tolerance": tolerance,
            "per_position": [float(x) for x in per_position], "length": length}
