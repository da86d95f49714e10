"""Two scoring backends behind one interface.

- `HFScorer`: any Hugging Face causal LM with RoPE (and our Megatron checkpoints converted
  in memory by `pretrain.hf.export.megatron_to_llama`). SDPA attention with `is_causal`, so
  memory grows linearly with the evaluation length; the LM head runs in chunks so logits
  are never [L, V] at once. Float evaluation positions go in as `position_ids`; replacement
  inverse frequencies / YaRN attention factor are written into the rotary module(s) for
  the duration of a call.
- `MegatronScorer`: our `FloatPositionGPTModel` directly (the local spec materialises the
  L×L scores: for small L and for proving the HF path equal).

Both return losses over the tokenizer's vocabulary only (Megatron's padding rows are
dropped), so the two backends compute the same distribution.
"""

# Reaches into transformers internals (HF backend; checked against transformers 5.23.0):
# - the rotary modules' state, swapped for one call: listed in pretrain/evaluation/hf_rope.py.
# - `config._attn_implementation` (attention_entropy): switched to "eager" for one call, the only
#   attention that returns probabilities, and restored.
# - `DynamicCache.layers[i].keys/values` (_keep_last): truncated to the paper's sliding KV window.
# Reaches into Megatron-Core internals (Megatron backend; checked against megatron-core 0.16.1, 0.17.1, 0.18.2 and
# 0.19.2; megatron_ext.versions.MODEL_REACHES, checked when the model is built):
# - local `DotProductAttention.attention_dropout` (a submodule): a forward hook on it reads the attention
#   probabilities for the entropy metric (SDPA cores take Megatron's unfused path for that call).

from __future__ import annotations

import abc
import inspect
import logging
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from megatron_ext.positions import PositionConfig, RopePositions, RopeScaling, build_sampler, scaled_inv_freq
from pretrain.evaluation.hf_rope import hf_rope, rotary_modules

log = logging.getLogger(__name__)

from pretrain.evaluation.memory import HEAD_CHUNK  # noqa: E402  (positions per LM-head call; the estimate uses it)


@dataclass
class RunInfo:
    """What a record needs to know about the evaluated model."""

    name: str
    train_window: int
    strategy: str = "none"
    seed: int | None = None
    parameters: int | None = None  # non-embedding parameters (Table 1 convention) when known
    source: str = ""
    extra: dict = field(default_factory=dict)


class Scorer(abc.ABC):
    """A causal LM that returns per-token losses at given RoPE positions."""

    backend: str = ""

    def __init__(self, info: RunInfo, vocab_size: int, rotary_dim: int, rotary_base: float,
                 positions: PositionConfig | None = None, rope_scaling: RopeScaling | None = None,
                 num_layers: int = 1) -> None:
        self.info = info
        self.vocab_size = int(vocab_size)
        self.rotary_dim, self.rotary_base = int(rotary_dim), float(rotary_base)
        self.rope_scaling = rope_scaling
        config = positions or PositionConfig()
        # The run's own evaluation rule (alpha = 1, RFS eval positions, warp -> PI, its rope_scaling).
        self._sampler = build_sampler(config, seed=info.seed or 0, train_seq_len=info.train_window,
                                      num_layers=num_layers, rotary_dim=self.rotary_dim,
                                      rotary_base=self.rotary_base, total_steps=info.extra.get("train_iters") or 1)

    @property
    def train_window(self) -> int:
        """The training window w."""
        return self.info.train_window

    def eval_positions(self, seq_len: int) -> RopePositions:
        """The run's evaluation positions for seq_len, with the --rope-scaling override on top."""
        # DroPE: a checkpoint from before its switch is the RoPE model it was then (None: the finished run)
        rope = self._sampler.evaluation(seq_len, trained_steps=self.info.extra.get("iteration"))
        if self.rope_scaling is None or self.rope_scaling.kind == "none":
            return rope
        inv_freq, factor = scaled_inv_freq(self.rotary_dim, self.rotary_base, self.rope_scaling, seq_len)
        return RopePositions(rope.positions, inv_freq=inv_freq, attention_factor=factor)

    def check_tokens(self, tokens: torch.Tensor) -> None:
        """Clear error when token ids exceed the model's vocabulary (wrong tokenizer)."""
        top = int(tokens.max())
        if top >= self.vocab_size:
            raise ValueError(f"token id {top} >= the model's vocabulary size {self.vocab_size}: the evaluation "
                             "data was tokenised with a different tokenizer than the model's")

    # Backends implement these three.
    @abc.abstractmethod
    def hidden_and_head(self, tokens: torch.Tensor, rope: RopePositions) -> tuple[torch.Tensor, Any]:
        """Final hidden states [b, s, h] and a callable mapping hidden -> logits over the vocabulary."""

    @abc.abstractmethod
    def attention_entropy(self, tokens: torch.Tensor, rope: RopePositions) -> torch.Tensor:
        """Per-query attention entropy [b, s], averaged over heads and layers."""

    def kv_cache_losses(self, tokens: torch.Tensor, window: int, chunk: int) -> torch.Tensor:
        """Per-position loss [b, s-1] under the paper's truncated-KV-cache sliding window."""
        raise ValueError(f"the {self.backend} backend has no KV-cache path: use --backend hf for --gain-method kv_cache")

    # Shared on top.
    @torch.no_grad()
    def token_losses(self, tokens: torch.Tensor, rope: RopePositions | None = None) -> torch.Tensor:
        """Loss [b, s-1] of predicting token i+1 from the query at position i (one causal pass)."""
        self.check_tokens(tokens)
        rope = self.eval_positions(tokens.shape[1]) if rope is None else rope
        hidden, head = self.hidden_and_head(tokens, rope)
        targets = tokens[:, 1:].to(hidden.device)  # the spans arrive on the CPU; the model may be on a GPU
        losses = []
        for start in range(0, tokens.shape[1] - 1, HEAD_CHUNK):
            stop = min(start + HEAD_CHUNK, tokens.shape[1] - 1)
            logits = head(hidden[:, start:stop]).float()
            losses.append(F.cross_entropy(logits.transpose(1, 2), targets[:, start:stop], reduction="none"))
        return torch.cat(losses, dim=1)

    @torch.no_grad()
    def next_token_logits(self, tokens: torch.Tensor, rope: RopePositions | None = None) -> torch.Tensor:
        """Logits [b, V] for the token after the last one."""
        self.check_tokens(tokens)
        rope = self.eval_positions(tokens.shape[1]) if rope is None else rope
        hidden, head = self.hidden_and_head(tokens, rope)
        return head(hidden[:, -1:]).float()[:, 0]


# --------------------------------------------------------------------------- HF backend


class HFScorer(Scorer):
    """Scores with a transformers causal LM (SDPA, memory linear in L)."""

    backend = "hf"

    def __init__(self, model: torch.nn.Module, info: RunInfo, *, positions: PositionConfig | None = None,
                 rope_scaling: RopeScaling | None = None, vocab_size: int | None = None) -> None:
        self.model = model.eval()
        config = model.config
        rotary = rotary_modules(model)
        if not rotary:
            raise ValueError(f"{type(model).__name__} has no RoPE (no rotary module with inv_freq)")
        inv_freq = rotary[0].inv_freq
        rope_params = getattr(config, "rope_parameters", None) or {}
        base = rope_params.get("rope_theta", getattr(config, "rope_theta", None))
        if base is None:  # recover the base from the buffer: inv_freq[1] = base ** (-2 / d)
            base = float(inv_freq[1].double() ** (-inv_freq.numel()))
        super().__init__(info, vocab_size or config.vocab_size, 2 * inv_freq.numel(), float(base), positions,
                         rope_scaling, num_layers=getattr(config, "num_hidden_layers", 1))
        self.device = next(model.parameters()).device

    def _inputs(self, tokens: torch.Tensor, rope: RopePositions) -> dict:
        positions = rope.positions.to(self.device, torch.float32)
        positions = positions[None].expand(tokens.shape[0], -1) if positions.dim() == 1 else positions
        # An explicit all-ones mask: without it transformers reads non-unit position gaps as
        # packed sequences; with it SDPA still runs is_causal (no L×L mask is built).
        return dict(input_ids=tokens.to(self.device), attention_mask=torch.ones_like(tokens, device=self.device),
                    position_ids=positions, use_cache=False)

    def _decoder(self):
        """The body that returns last_hidden_state: get_decoder(), unless it is the model itself (Llama 4 text
        under transformers 5.x), then the model's `model`."""
        decoder = self.model.get_decoder() if hasattr(self.model, "get_decoder") else None
        if decoder is None or decoder is self.model:
            decoder = getattr(self.model, "model", None) or self.model.base_model
        return decoder

    def hidden_and_head(self, tokens, rope):
        base = self._decoder()
        with hf_rope(self.model, rope):
            hidden = base(**self._inputs(tokens, rope)).last_hidden_state
        lm_head = self.model.get_output_embeddings()
        return hidden, lambda h: lm_head(h)[..., :self.vocab_size]

    @torch.no_grad()
    def attention_entropy(self, tokens, rope):
        layers = [m for name, m in self.model.named_modules() if name.endswith("self_attn")]
        if not layers:
            raise ValueError(f"{type(self.model).__name__}: no '*.self_attn' modules to read attention from")
        total = torch.zeros(tokens.shape, dtype=torch.float64)

        def hook(module, args, output):
            weights = output[1]  # eager attention returns the probabilities [b, h, q, k]
            total.add_(torch.special.entr(weights.double()).sum(-1).mean(1).cpu())
            return (output[0], None) + tuple(output[2:])  # drop the L×L tensor at once

        config = self.model.config
        previous = config._attn_implementation
        handles = [m.register_forward_hook(hook) for m in layers]
        try:
            # Only eager attention exposes the probabilities (this materialises L×L per layer).
            config._attn_implementation = "eager"
            with hf_rope(self.model, rope):
                self.model(**self._inputs(tokens, rope))
        finally:
            config._attn_implementation = previous
            for h in handles:
                h.remove()
        return (total / len(layers)).float()

    @torch.no_grad()
    def kv_cache_losses(self, tokens, window, chunk):
        from transformers import DynamicCache

        self.check_tokens(tokens)
        rope = self.eval_positions(window + chunk)
        lm_head = self.model.get_output_embeddings()
        base = self.model.get_decoder() if hasattr(self.model, "get_decoder") else self.model.base_model
        tokens = tokens.to(self.device)
        cache, pieces = DynamicCache(config=self.model.config), []
        cache_arg = "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"  # 5.x name
        with hf_rope(self.model, rope):
            for start in range(0, tokens.shape[1], chunk):
                piece = tokens[:, start:start + chunk]
                past = cache.get_seq_length()
                # Paper §3: the RoPE offset restarts at the cache size (<= window).
                offsets = rope.positions[past:past + piece.shape[1]].to(self.device)
                hidden = base(input_ids=piece, position_ids=offsets[None].expand(piece.shape[0], -1),
                              **{cache_arg: cache}, use_cache=True).last_hidden_state
                pieces.append(lm_head(hidden)[..., :self.vocab_size].float())
                _keep_last(cache, window)
        logits = torch.cat(pieces, dim=1)[:, :-1]
        return F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none").cpu()


def _keep_last(cache, window: int) -> None:
    """Truncate every layer of a DynamicCache to its most recent `window` entries."""
    for layer in cache.layers:
        if layer.keys is not None and layer.keys.shape[-2] > window:
            layer.keys = layer.keys[..., -window:, :]
            layer.values = layer.values[..., -window:, :]


# --------------------------------------------------------------------- Megatron backend


class MegatronScorer(Scorer):
    """Scores with FloatPositionGPTModel (TP=PP=1, this process); materialises L×L scores."""

    backend = "megatron"

    def __init__(self, model: torch.nn.Module, model_config, info: RunInfo, *,
                 positions: PositionConfig | None = None, rope_scaling: RopeScaling | None = None) -> None:
        self.model = model.eval()
        self.model_config = model_config
        super().__init__(info, model_config.vocab_size, model_config.rotary_dim, model_config.rotary_base,
                         positions, rope_scaling, num_layers=model_config.num_layers)
        self.device = next(model.parameters()).device

    def _rope(self, rope: RopePositions) -> RopePositions:
        def move(t):
            return None if t is None else t.to(self.device)
        return RopePositions(move(rope.positions), move(rope.layer_positions), move(rope.inv_freq),
                             rope.attention_factor)

    def hidden_and_head(self, tokens, rope):
        # Megatron fuses the head into forward; logits come back whole ([b, s, V_padded]).
        logits = self.model(tokens.to(self.device), self._rope(rope), None)
        return logits, lambda h: h[..., :self.vocab_size]

    @torch.no_grad()
    def attention_entropy(self, tokens, rope):
        from megatron_ext.sdpa_attention import materialized_probabilities
        from megatron_ext.versions import MissingReachError, check_model_reaches, core_attentions

        cores = core_attentions(self.model, local_only=True)
        missing = check_model_reaches(self.model)["attention_dropout"]
        if missing or not cores:
            raise MissingReachError(missing or "attention entropy reads Megatron's local DotProductAttention "
                                    "probabilities; this model has none (model.transformer_impl=local)")
        total = torch.zeros(tokens.shape, dtype=torch.float64)

        def hook(module, args, output):  # dropout's output: the probabilities [b, h, q, k]
            total.add_(torch.special.entr(output.double()).sum(-1).mean(1).cpu())

        handles = [m.attention_dropout.register_forward_hook(hook) for m in cores]
        try:
            with materialized_probabilities(self.model):  # SDPA never forms the probabilities
                self.model(tokens.to(self.device), self._rope(rope), None)
        finally:
            for h in handles:
                h.remove()
        return (total / len(cores)).float()
