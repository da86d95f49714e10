"""Per-sample positions through the Megatron model: a batch equals each sequence run alone with its own draw."""

import pytest
import torch

from megatron_ext.model import build_model
from megatron_ext.positions import PositionConfig, build_sampler
from pretrain.table import model_preset

B = 3
CONFIG = model_preset("tiny")

PER_SAMPLE = {
    "posaug": {"strategy": "posaug"},
    "posaug_top_layers": {"strategy": "posaug", "layer_mode": "top", "layer_count": 2},
    "posaug_independent_layers": {"strategy": "posaug", "layer_mode": "independent"},
    "random_base": {"strategy": "random_base"},
    "rfs": {"strategy": "rfs"},
    "rpe": {"strategy": "rpe", "max_position": 256},
    "warp": {"strategy": "warp", "p_head": 0.5, "p_tail": 0.5},
}


@pytest.fixture(scope="module")
def model(megatron_world):
    torch.manual_seed(0)
    return build_model(CONFIG, per_sample_positions=True).eval()


@pytest.mark.parametrize("name", list(PER_SAMPLE))
def test_batched_per_sample_logits_equal_each_sequence_alone_with_its_global_index(model, name):
    sampler = build_sampler(PositionConfig(granularity="per_sample", **PER_SAMPLE[name]), seed=5,
                            train_seq_len=CONFIG.seq_length, num_layers=CONFIG.num_layers,
                            rotary_dim=CONFIG.rotary_dim, rotary_base=CONFIG.rotary_base, total_steps=10)
    tokens = torch.randint(0, 256, (B, CONFIG.seq_length), generator=torch.Generator().manual_seed(3))
    first = 4  # the microbatch starts at global sample 4, as on a second DP rank
    with torch.no_grad():
        batched = model(tokens, sampler.training(3, CONFIG.seq_length, first_sample=first, batch_size=B), None)
        for i in range(B):
            alone = model(tokens[i:i + 1],
                          sampler.training(3, CONFIG.seq_length, first_sample=first + i, batch_size=1), None)
            torch.testing.assert_close(batched[i:i + 1], alone, atol=1e-5, rtol=1e-5)
        # The draw matters: the same tokens under other sequences' draws give other logits
        # (several, since two warp draws can both be the plain or the tail row).
        others = [model(tokens[:1], sampler.training(3, CONFIG.seq_length, first_sample=k, batch_size=1), None)
                  for k in range(first + B, first + B + 4)]
        assert any(not torch.allclose(batched[:1], other, atol=1e-3) for other in others)
