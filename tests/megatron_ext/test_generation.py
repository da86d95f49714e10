"""Greedy decoding with the Megatron model at evaluation positions equals the HF export's `generate`,
and the RoPE hook refuses float positions under a Megatron inference context. Runtime: ~90 s on the shared 2-core machine.
"""

import pytest
import torch

from megatron_ext.generation import greedy_generate
from megatron_ext.model import build_model
from megatron_ext.positions import PositionConfig, RopePositions, RopeScaling, build_sampler
from pretrain.table import model_preset
from pretrain.hf.export import megatron_to_llama

VOCAB, PROMPT, NEW = 200, 10, 30  # 40 tokens: past the 32-token training window
CONFIG = model_preset("tiny", vocab_size=VOCAB)
SCALINGS = {"base": ("none", None), "pi_2": ("pi", 2.0), "yarn_4": ("yarn", 4.0)}


@pytest.fixture(scope="module")
def model(megatron_world):
    """The tiny model with weights spread wide enough that greedy choices are not near-ties."""
    model = build_model(CONFIG)
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g) * 0.15
            p.copy_(1.0 + noise if "layernorm" in name else noise)
    return model.eval()


@pytest.fixture(scope="module")
def prompt():
    return torch.randint(0, VOCAB, (2, PROMPT), generator=torch.Generator().manual_seed(9))


def evaluation_positions(kind, factor):
    """The run's evaluation positions (PositionSampler.evaluation) for a rope_scaling setting."""
    sampler = build_sampler(PositionConfig(rope_scaling=kind, rope_scaling_factor=factor), seed=0,
                            train_seq_len=CONFIG.seq_length, num_layers=CONFIG.num_layers,
                            rotary_dim=CONFIG.rotary_dim, rotary_base=CONFIG.rotary_base, total_steps=1)
    return sampler.evaluation


def hf_rope_scaling(kind, factor):
    if kind == "none":
        return None
    return RopeScaling(kind, factor=factor, original_max_position_embeddings=CONFIG.seq_length)


@pytest.mark.parametrize("scaling", list(SCALINGS))
def test_greedy_generation_equals_hf_generate_with_the_same_rope_scaling(model, prompt, scaling):
    kind, factor = SCALINGS[scaling]
    got = greedy_generate(model, prompt, NEW, evaluation_positions(kind, factor), vocab_size=VOCAB)
    hf = megatron_to_llama(model, CONFIG, rope_scaling=hf_rope_scaling(kind, factor))
    expected = hf.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW,
                           do_sample=False, num_beams=1, pad_token_id=0)
    assert torch.equal(got, expected)


def test_scaled_evaluation_positions_change_the_continuation(model, prompt):
    base = greedy_generate(model, prompt, NEW, evaluation_positions("none", None), vocab_size=VOCAB)
    scaled = greedy_generate(model, prompt, NEW, evaluation_positions("pi", 2.0), vocab_size=VOCAB)
    assert torch.equal(base[:, :PROMPT], scaled[:, :PROMPT]) and not torch.equal(base, scaled)


def test_generation_leaves_a_training_model_in_training_mode(megatron_world, prompt):
    model = build_model(CONFIG)
    greedy_generate(model, prompt, 2, lambda n: torch.arange(n, dtype=torch.float32))
    assert model.training


@pytest.mark.parametrize("positions", [0.5 * torch.arange(PROMPT, dtype=torch.float32),
                                       RopePositions(torch.arange(PROMPT, dtype=torch.float32))],
                         ids=["float_tensor", "rope_positions"])
def test_float_positions_with_a_megatron_inference_context_are_refused(model, prompt, positions):
    from megatron.core.inference.contexts import StaticInferenceContext

    context = StaticInferenceContext(max_batch_size=2, max_sequence_length=64)
    with pytest.raises(ValueError, match="greedy_generate"):
        model(prompt, positions, None, inference_context=context)
