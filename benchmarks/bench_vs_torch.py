"""Our trainer's training step against a minimal plain-PyTorch loop of the same model, on CPU.

    .venv/bin/python benchmarks/bench_vs_torch.py [--sizes cpu-small 10m] [--seq 256] [--micro-batch 8] [--steps 10]

Same architecture (RMSNorm, SwiGLU, GQA, RoPE, tied embeddings; attention through
torch.nn.functional.scaled_dot_product_attention in the plain loop), same initial weights (the
Megatron model's, copied), same batches, same AdamW settings (no weight decay on norms, grad
clipping 1.0, constant lr). Steps are interleaved (ours, plain, ours, plain, ...) so load drift on
a shared machine hits both alike; the median step time gives tokens/s. Target: ours / plain ≥ 0.9.
Default sizes: cpu-small (the CPU reproduction's model) and 10m (the smallest Table 1 size); `tiny`
(the unit-test model, 0.15M parameters) measures per-call overhead more than training speed.
A torch.profiler pass then lists the operators where our step spends more time than the plain one.
"""

import argparse
import math
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pretrain.console import quiet_known_warnings  # noqa: E402

quiet_known_warnings()

from megatron_ext.model import ParallelConfig  # noqa: E402
from megatron_ext.positions import PositionConfig, build_sampler  # noqa: E402
from pretrain.table import model_preset  # noqa: E402
from pretrain.hf.export import megatron_state_to_llama  # noqa: E402
from pretrain.trainer import distributed  # noqa: E402
from pretrain.trainer.config import OptimizerSettings  # noqa: E402
from pretrain.trainer.engine import Engine  # noqa: E402

LR, BETAS, EPS, WD, CLIP = 3e-3, (0.9, 0.95), 1e-8, 0.1, 1.0


class Block(nn.Module):
    """Pre-norm decoder layer: RMSNorm → GQA attention with RoPE → RMSNorm → SwiGLU."""

    def __init__(self, m) -> None:
        super().__init__()
        h, d = m.hidden_size, m.kv_channels
        self.heads, self.groups, self.d = m.num_attention_heads, m.num_query_groups, d
        self.input_layernorm = nn.RMSNorm(h, eps=m.layernorm_epsilon)
        self.q_proj = nn.Linear(h, self.heads * d, bias=False)
        self.k_proj = nn.Linear(h, self.groups * d, bias=False)
        self.v_proj = nn.Linear(h, self.groups * d, bias=False)
        self.o_proj = nn.Linear(self.heads * d, h, bias=False)
        self.post_attention_layernorm = nn.RMSNorm(h, eps=m.layernorm_epsilon)
        self.gate_proj = nn.Linear(h, m.ffn_hidden_size, bias=False)
        self.up_proj = nn.Linear(h, m.ffn_hidden_size, bias=False)
        self.down_proj = nn.Linear(m.ffn_hidden_size, h, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        y = self.input_layernorm(x)
        q = self.q_proj(y).view(b, s, self.heads, self.d).transpose(1, 2)
        k = self.k_proj(y).view(b, s, self.groups, self.d).transpose(1, 2)
        v = self.v_proj(y).view(b, s, self.groups, self.d).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.groups != self.heads)
        x = x + self.o_proj(attn.transpose(1, 2).reshape(b, s, -1))
        y = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class PlainGPT(nn.Module):
    """The same model in plain PyTorch, weights named as Hugging Face Llama names them."""

    def __init__(self, m, vocab: int) -> None:
        super().__init__()
        self.m = m
        self.embed_tokens = nn.Embedding(vocab, m.hidden_size)
        self.layers = nn.ModuleList(Block(m) for _ in range(m.num_layers))
        self.norm = nn.RMSNorm(m.hidden_size, eps=m.layernorm_epsilon)
        inv_freq = 1.0 / (m.rotary_base ** (torch.arange(0, m.kv_channels, 2, dtype=torch.float32) / m.kv_channels))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        angles = torch.outer(torch.arange(tokens.shape[1], dtype=torch.float32), self.inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        cos, sin = angles.cos(), angles.sin()
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x) @ self.embed_tokens.weight.t()  # tied output layer

    def load_llama_state(self, state: dict) -> None:
        """Weights from megatron_state_to_llama (names with 'model.' / 'self_attn.' / 'mlp.' prefixes)."""
        renamed = {k.removeprefix("model.").replace("self_attn.", "").replace("mlp.", ""): v for k, v in state.items()}
        missing, unexpected = self.load_state_dict(renamed, strict=False)
        if missing or unexpected:
            raise RuntimeError(f"weight copy: missing {missing}, unexpected {unexpected}")


def plain_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    """AdamW with Megatron's default grouping: no weight decay on 1-D parameters (norms) and biases."""
    decay = [p for p in model.parameters() if p.dim() > 1]
    no_decay = [p for p in model.parameters() if p.dim() <= 1]
    return torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=LR, betas=BETAS, eps=EPS)


def plain_step(model: PlainGPT, optimizer, batch: dict) -> float:
    """One optimizer step of the plain loop."""
    optimizer.zero_grad(set_to_none=True)
    logits = model(batch["tokens"])
    loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), batch["labels"].reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    optimizer.step()
    return loss.item()


def build_pair(size: str, seq: int):
    """(our Engine, its sampler, the plain model, its optimizer) with the same initial weights."""
    m = model_preset(size, seq_length=seq)
    torch.manual_seed(0)
    engine = Engine(m, ParallelConfig(), OptimizerSettings(lr=LR, min_lr=LR, weight_decay=WD, adam_beta1=BETAS[0],
                                                           adam_beta2=BETAS[1], adam_eps=EPS, clip_grad=CLIP,
                                                           lr_decay_style="constant"), 10 ** 6)
    sampler = build_sampler(PositionConfig(), seed=0, train_seq_len=seq, num_layers=m.num_layers,
                            rotary_dim=m.rotary_dim, rotary_base=m.rotary_base, total_steps=10 ** 6)
    padded = m.padded_vocab_size()
    plain = PlainGPT(m, padded)
    plain.load_llama_state(megatron_state_to_llama(engine.model, m, vocab_size=padded))
    return m, engine, sampler, plain, plain_optimizer(plain)


def batches(m, micro_batch: int, seq: int, count: int) -> list[dict]:
    """`count` fixed random-token batches (the same for both loops)."""
    generator = torch.Generator().manual_seed(1)
    out = []
    for _ in range(count):
        tokens = torch.randint(0, m.vocab_size, (micro_batch, seq + 1), generator=generator)
        out.append({"tokens": tokens[:, :-1], "labels": tokens[:, 1:], "loss_mask": torch.ones(micro_batch, seq)})
    return out


def _profile(step_fn, steps: int) -> dict[str, float]:
    """Self CPU time (ms) per operator over `steps` calls."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(steps):
            step_fn(i)
    totals: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        totals[event.key] += event.self_cpu_time_total / 1e3
    return totals


def bench(size: str, seq: int, micro_batch: int, steps: int, profile_steps: int) -> dict:
    """Interleaved timing, equality check of the first losses, and the profile difference."""
    m, engine, sampler, plain, optimizer = build_pair(size, seq)
    data = batches(m, micro_batch, seq, steps + 2 + 2 * profile_steps)
    ours_losses, plain_losses, ours_t, plain_t = [], [], [], []
    for i in range(steps + 2):
        start = time.perf_counter()
        ours_losses.append(engine.train_step(iter([data[i]]), sampler, i, 1, micro_batch, seq).loss)
        ours_t.append(time.perf_counter() - start)
        start = time.perf_counter()
        plain_losses.append(plain_step(plain, optimizer, data[i]))
        plain_t.append(time.perf_counter() - start)
    ours_s, plain_s = statistics.median(ours_t[2:]), statistics.median(plain_t[2:])
    base = steps + 2
    ours_prof = _profile(lambda i: engine.train_step(iter([data[base + i]]), sampler, base + i, 1, micro_batch, seq),
                         profile_steps)
    plain_prof = _profile(lambda i: plain_step(plain, optimizer, data[base + i]), profile_steps)
    return {"size": size, "params": m.non_embedding_parameters(), "ours_s": ours_s, "plain_s": plain_s,
            "tokens": micro_batch * seq, "losses": (ours_losses[:3], plain_losses[:3]),
            "profile": (ours_prof, plain_prof), "profile_steps": profile_steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["cpu-small", "10m"])
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per loop (after 2 warm-up steps)")
    parser.add_argument("--profile-steps", type=int, default=3)
    args = parser.parse_args()
    distributed.initialize(ParallelConfig(), seed=0)
    print(f"CPU, {torch.get_num_threads()} threads, seq {args.seq}, micro-batch {args.micro_batch}, "
          f"median of {args.steps} interleaved steps")
    results = [bench(size, args.seq, args.micro_batch, args.steps, args.profile_steps) for size in args.sizes]
    print(f"\n{'size':<10}{'params':>9}{'ours tok/s':>12}{'plain tok/s':>13}{'ratio':>8}   first losses ours | plain")
    for r in results:
        ours, plain = r["tokens"] / r["ours_s"], r["tokens"] / r["plain_s"]
        print(f"{r['size']:<10}{r['params'] / 1e6:>8.2f}M{ours:>12.0f}{plain:>13.0f}{ours / plain:>8.3f}   "
              + ", ".join(f"{v:.4f}" for v in r["losses"][0]) + " | "
              + ", ".join(f"{v:.4f}" for v in r["losses"][1]))
    for r in results:
        ours_prof, plain_prof = r["profile"]
        n = r["profile_steps"]
        total_ours, total_plain = sum(ours_prof.values()) / n, sum(plain_prof.values()) / n
        print(f"\n{r['size']}: operator self CPU time per step, ours {total_ours:.1f} ms vs plain {total_plain:.1f} ms; "
              "largest differences (ours − plain):")
        names = set(ours_prof) | set(plain_prof)
        diffs = sorted(((ours_prof.get(k, 0.0) - plain_prof.get(k, 0.0)) / n, k) for k in names)
        for diff, name in diffs[::-1][:10]:
            print(f"  {diff:+8.2f} ms  {name}  (ours {ours_prof.get(name, 0.0) / n:.2f}, "
                  f"plain {plain_prof.get(name, 0.0) / n:.2f})")
        print("  ... and where plain spends more:")
        for diff, name in diffs[:4]:
            if diff < 0:
                print(f"  {diff:+8.2f} ms  {name}")
    distributed.destroy()
    if any(math.isnan(v) for r in results for v in r["losses"][0]):
        sys.exit(1)


if __name__ == "__main__":
    main()
