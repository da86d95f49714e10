"""Eval's peak memory, estimated from the model's config before any weight is read, and the refusal of what won't fit.

The estimate follows what `eval run --lengths` holds at its peak (fp32 throughout, no autograd):
- the weights: a Megatron checkpoint is loaded and then converted to an HF Llama for the default backend, and
  both copies are alive while it scores (pretrain/evaluation/scorer_loading.load_scorer);
- one decoder layer's activations over every position of the batch (the layers run one after another and
  keep nothing), the larger of the attention phase and the SwiGLU MLP phase, plus the residual stream;
- the LM head's logits over HEAD_CHUNK positions (scorers.HEAD_CHUNK) with cross-entropy's log-softmax copy;
- for the Megatron backend instead: the local attention's L x L scores and probabilities per head, and the
  whole [b, L, V] logits (Megatron fuses the head into forward).
The other modes that grow with length are estimated from the same terms (`requests`): context gain as a
--lengths pass at its largest C, passkey / needle as one sequence of the prompt and answer per pass, the attention
entropy with its L x L probabilities. Under backend "auto" the estimate is the one of the scorer auto picks
(scorer_loading.resolve_backend: the Megatron model for SSMax or NoPE-interleaved runs, whose L x L term dominates).
benchmarks/results/eval_memory_notes.md ("Estimate vs measured") records measured / estimated on CPU.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

FLOAT = 4  # bytes: evaluation runs in float32
TOKEN = 8  # bytes: int64 token ids
# What the terms below leave out, from CPU measurements (benchmarks/results/eval_memory_notes.md, "Estimate vs
# measured", tiny model at 16k-98k tokens): the activation terms as derived account for ~0.71 of the measured
# growth per token (the rest: elementwise temporaries, RMSNorm's float copies, allocator slack), and the growth
# has a ~100 MiB intercept (libraries initialised while the model loads, the evaluation stream read into memory).
ACTIVATION_MARGIN = 1.4
RUNTIME_ALLOWANCE = 128 * 2**20
HEAD_CHUNK = 1024  # positions per LM-head call in scorers.Scorer.token_losses (bounds the [chunk, V] logits)


@dataclass(frozen=True)
class Shape:
    """The sizes of a RoPE decoder that decide eval's memory."""

    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    megatron_checkpoint: bool

    @property
    def parameters(self) -> int:
        """Weights of the model (embedding, output layer when untied, attention, SwiGLU MLP, norms)."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        layer = self.hidden * (q + 2 * kv) + q * self.hidden + 3 * self.hidden * self.ffn + 2 * self.hidden
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.layers * layer + self.hidden


def model_shape(source: str | Path) -> Shape | None:
    """The Shape recorded by a Megatron run (train_state.json / config.yaml) or an HF config.json; None if unknown."""
    path = Path(source)
    try:
        from pretrain.trainer.run_dir import read_train_state

        model = read_train_state(path)["config"]["model"]
        heads = model["num_attention_heads"]
        return Shape(layers=model["num_layers"], hidden=model["hidden_size"], ffn=model["ffn_hidden_size"],
                     heads=heads, kv_heads=model.get("num_query_groups") or heads,
                     head_dim=model.get("kv_channels") or model["hidden_size"] // heads, vocab=model["vocab_size"],
                     tied=not model.get("untie_embeddings_and_output_weights", False), megatron_checkpoint=True)
    except (FileNotFoundError, OSError, ValueError, KeyError, TypeError):
        pass
    try:
        hf = json.loads((path / "config.json").read_text())
        heads = hf["num_attention_heads"]
        return Shape(layers=hf["num_hidden_layers"], hidden=hf["hidden_size"], ffn=hf["intermediate_size"],
                     heads=heads, kv_heads=hf.get("num_key_value_heads") or heads,
                     head_dim=hf.get("head_dim") or hf["hidden_size"] // heads, vocab=hf["vocab_size"],
                     tied=bool(hf.get("tie_word_embeddings", False)), megatron_checkpoint=False)
    except (OSError, ValueError, KeyError, TypeError):
        return None  # not a model eval can read: load_scorer names the problem


def peak_bytes(shape: Shape, length: int, batch: int, num_spans: int, backend: str = "hf") -> int:
    """Estimated peak bytes of scoring `num_spans` spans of `length` tokens, `batch` spans per forward pass."""
    copies = 2 if shape.megatron_checkpoint and backend == "hf" else 1
    weights = copies * shape.parameters * FLOAT
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    # normed input (+ its float copy), q/k/v, RoPE's rotated q/k and their temporaries, k/v repeated to the query
    # heads (GQA), attention output
    attention = 2 * shape.hidden + 7 * q + 3 * kv
    mlp = 2 * shape.hidden + 4 * shape.ffn  # normed input, gate, up, silu(gate), their product
    per_token = FLOAT * ACTIVATION_MARGIN * (shape.hidden + max(attention, mlp) + 4 * shape.head_dim)  # residual,
    # the larger phase, RoPE's angle, cos and sin tables
    tokens = batch * length
    if backend == "megatron":
        scores = 2 * batch * shape.heads * length * length * FLOAT  # local attention: scores and probabilities
        logits = 2 * tokens * shape.vocab * FLOAT
    else:
        scores = 0
        logits = 2 * batch * min(length, HEAD_CHUNK) * shape.vocab * FLOAT
    spans_and_losses = num_spans * (length + 1) * (TOKEN + FLOAT)
    return int(weights + tokens * per_token + scores + logits + spans_and_losses + RUNTIME_ALLOWANCE)


def available_bytes(device: str) -> int:
    """Memory eval may use: the GPU's free memory on CUDA, else the host's available memory (trainer's reader)."""
    if str(device).startswith("cuda"):
        import torch

        return torch.cuda.mem_get_info(torch.device(device))[0]
    from pretrain.trainer.micro_batch import host_available_bytes

    return host_available_bytes()


def entropy_bytes(shape: Shape, length: int, num_spans: int, backend: str) -> int:
    """Estimated peak bytes of the attention entropy (--entropy-spans) over spans of `length`, one per pass:
    eager attention's L x L scores and probabilities per head (either backend), their float64 copy and its
    entropy, and the full [L, V] logits (the pass goes through the whole model)."""
    return peak_bytes(shape, length, 1, num_spans, "megatron") + 2 * shape.heads * length * length * 8


def decode_bytes(shape: Shape, length: int, backend: str) -> int:
    """Estimated peak bytes of a passkey / needle example of `length` tokens: greedy decoding, each new token a
    full pass over the prompt and the answer so far (one sequence per pass)."""
    return peak_bytes(shape, length + DECODE_TOKENS, 1, 1, backend)


DECODE_TOKENS = 12  # the longest answer greedy decoding produces (passkey.ruler_niah's max_new_tokens)


def largest_length(need: Callable[[int], int], budget: int) -> int:
    """The longest length whose estimated `need(length)` fits `budget` (0 when not even 2 tokens fit)."""
    low, high = 1, 2
    while need(high) <= budget:
        low, high = high, high * 2
        if high > 2**40:
            return high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if need(middle) <= budget else (low, middle)
    return low if low >= 2 else 0


def _batch(length: int, num_spans: int, batch_size: int | None, max_batch_tokens: int) -> int:
    # metrics.auto_batch_size's rule, capped by the spans there are
    return min(num_spans, batch_size or max(1, max_batch_tokens // max(1, length)))


@dataclass(frozen=True)
class Request:
    """One evaluation mode that grows with length: the flag that sets its length(s), and what it runs."""

    flag: str  # what the user lowers: --lengths, --context-gain, --passkey-lengths, --ruler-lengths
    lengths: list[int]
    mode: str  # "score" (spans batched by --batch-size/--max-batch-tokens), "decode" or "entropy"
    what: str = ""  # named in the refusal when the mode is not the flag's own (the entropy at max --lengths)


def requests(lengths: list[int] | None, context_gain: list[int] | None, passkey_lengths: list[int] | None,
             ruler_lengths: list[int] | None, entropy_spans: int) -> list[Request]:
    """The length-growing parts of an `eval run`, as record.evaluate runs them."""
    found = [Request("--lengths", list(lengths or []), "score"),
             Request("--context-gain", [max(context_gain)] if context_gain else [], "score",
                     "context gain (one full pass at the largest C)"),
             Request("--passkey-lengths", list(passkey_lengths or []), "decode", "passkey"),
             Request("--ruler-lengths", list(ruler_lengths or []), "decode", "needle")]
    if entropy_spans and lengths:
        found.append(Request("--lengths", [max(lengths)], "entropy",
                             "--entropy-spans (L x L attention probabilities at the largest --lengths)"))
    return [r for r in found if r.lengths]


def check_fits(source: str | Path, wanted: list[Request], num_spans: int, batch_size: int | None,
               max_batch_tokens: int, backend: str, device: str, entropy_spans: int = 1) -> None:
    """ValueError (one line) naming the flag and the largest length that fits, when an estimate exceeds memory.

    `backend` is the scorer that will run ("auto" already resolved: scorer_loading.resolve_backend)."""
    shape = model_shape(source)
    if shape is None:
        return
    budget = available_bytes(device)
    for request in wanted:
        def need(length: int, request: Request = request) -> int:
            if request.mode == "entropy":
                return entropy_bytes(shape, length, entropy_spans, backend)
            if request.mode == "decode":
                return decode_bytes(shape, length, backend)
            return peak_bytes(shape, length, _batch(length, num_spans, batch_size, max_batch_tokens), num_spans,
                              backend)

        for length in sorted(set(request.lengths), reverse=True):
            if need(length) > budget:
                where = "GPU memory free" if str(device).startswith("cuda") else "memory available"
                spans = _batch(length, num_spans, batch_size, max_batch_tokens)
                per_pass = (f"{spans} span(s) of {length} tokens per forward pass" if request.mode == "score"
                            else f"one sequence of {length}+ tokens per pass")
                what = f" for {request.what}" if request.what else ""
                lower = {"score": ", or --num-spans / --batch-size", "entropy": ", or pass --entropy-spans 0"}
                raise ValueError(f"{request.flag} {length} needs about {need(length) / 2**30:.1f} GiB{what} "
                                 f"({per_pass}, {backend} backend) but {budget / 2**30:.1f} GiB is {where}; the "
                                 f"largest length that fits is about {largest_length(need, budget)} (lower "
                                 f"{request.flag}{lower.get(request.mode, '')})")
