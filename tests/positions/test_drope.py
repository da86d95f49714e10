"""DroPE (strategy drope): RoPE before the switch step, no rotation in any layer after it (pure torch)."""

import re

import pytest
import torch
from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd

from megatron_ext.positions import PositionConfig, PositionSampler
from megatron_ext.positions.documents import Documents
from megatron_ext.positions.drope import phase, recalibration_steps, switch_step
from megatron_ext.positions.scaling import rope_inv_freq
from megatron_ext.rope_hook import rotary_angles

WINDOW, ROTARY_DIM, BASE, STEPS = 32, 16, 10000.0, 200


def make_sampler(total_steps: int = STEPS, **fields) -> PositionSampler:
    config = PositionConfig(**{"strategy": "drope", **fields})
    return PositionSampler(config, seed=3, train_seq_len=WINDOW, num_layers=2, rotary_dim=ROTARY_DIM,
                           rotary_base=BASE, total_steps=total_steps)


def rotated(rope_positions: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """q [s, b, h, d] rotated by the angles the hook builds from these positions (Megatron's unfused RoPE)."""
    return _apply_rotary_pos_emb_bshd(q, rotary_angles(rope_positions, rope_inv_freq(ROTARY_DIM, BASE)))


def test_the_default_recalibration_is_two_percent_of_the_steps_at_the_end_of_the_run():
    assert PositionConfig().drope_share == 0.02
    assert recalibration_steps(STEPS, 0.02) == 4 and switch_step(STEPS, 0.02) == 196
    assert switch_step(10, 0.02) == 9  # at least one step recalibrates
    assert switch_step(STEPS, 1.0) == 0  # every step: the recalibration run from checkpoint.load


def test_before_the_switch_the_positions_are_plain_ropes():
    sampler = make_sampler()
    for step in (0, 100, 195):
        rope = sampler.training(step, WINDOW, first_sample=0, batch_size=2)
        assert torch.equal(rope.positions, torch.arange(WINDOW, dtype=torch.float32)) and rope.inv_freq is None


@pytest.mark.parametrize("step", [196, 197, 199])
def test_after_the_switch_every_angle_is_zero_and_q_goes_through_unrotated(step):
    rope = make_sampler().training(step, WINDOW, first_sample=0, batch_size=2)
    angles = rotary_angles(rope.positions, rope_inv_freq(ROTARY_DIM, BASE))
    assert not angles.any() and rope.layer_positions is None and rope.inv_freq is None
    q = torch.randn(WINDOW, 2, 4, ROTARY_DIM)
    assert torch.equal(rotated(rope.positions, q), q)  # bitwise: cos 1, sin 0


def test_the_switch_step_is_the_first_without_rotation():
    sampler = make_sampler()
    q = torch.randn(WINDOW, 1, 2, ROTARY_DIM)
    before = sampler.training(195, WINDOW, first_sample=0, batch_size=1).positions
    after = sampler.training(196, WINDOW, first_sample=0, batch_size=1).positions
    assert not torch.equal(rotated(before, q), q) and torch.equal(rotated(after, q), q)


def test_posaug_pretraining_draws_posaugs_positions_bitwise_until_the_switch():
    fields = dict(alpha_min=0.125, alpha_max=8.0)
    drope = make_sampler(drope_pretraining="posaug", **fields)
    posaug = PositionSampler(PositionConfig(strategy="posaug", **fields), seed=3, train_seq_len=WINDOW, num_layers=2,
                             rotary_dim=ROTARY_DIM, rotary_base=BASE, total_steps=STEPS)
    for step in (0, 57, 195):
        got = drope.training(step, WINDOW, first_sample=0, batch_size=2).positions
        assert torch.equal(got, posaug.training(step, WINDOW, first_sample=0, batch_size=2).positions)
    assert not drope.training(196, WINDOW, first_sample=0, batch_size=2).positions.any()


def test_document_masked_windows_get_zero_positions_for_every_token_after_the_switch():
    documents = Documents(torch.tensor([[0] * 10 + [1] * 22, [0] * 32]))
    rope = make_sampler().training(199, WINDOW, first_sample=0, batch_size=2, documents=documents)
    assert rope.positions.shape == (2, WINDOW) and not rope.positions.any()


def test_evaluation_follows_the_phase_of_the_evaluated_weights():
    sampler = make_sampler()
    assert torch.equal(sampler.evaluation(4 * WINDOW, trained_steps=196).positions,
                       torch.arange(4 * WINDOW, dtype=torch.float32))  # never trained without RoPE
    for trained in (197, STEPS, None):  # None: the finished run
        assert not sampler.evaluation(4 * WINDOW, trained_steps=trained).positions.any()
    assert [sampler.phase(t) for t in (0, 196, 197, None)] == ["pretraining"] * 2 + ["recalibration"] * 2
    assert phase(1, STEPS, 1.0) == "recalibration" and phase(0, STEPS, 1.0) == "pretraining"


def test_other_strategies_ignore_the_trained_steps_and_have_no_phase():
    sampler = PositionSampler(PositionConfig(), seed=3, train_seq_len=WINDOW, num_layers=2, rotary_dim=ROTARY_DIM,
                              rotary_base=BASE, total_steps=STEPS)
    assert sampler.phase(STEPS) is None and sampler.switch_step is None
    assert torch.equal(sampler.evaluation(WINDOW, trained_steps=STEPS).positions,
                       torch.arange(WINDOW, dtype=torch.float32))


@pytest.mark.parametrize("fields, message", [
    ({"drope_share": 0}, "positions.drope_share must be in (0, 1]"),
    ({"drope_share": 1.5}, "positions.drope_share must be in (0, 1]"),
    ({"drope_pretraining": "rfs"}, "positions.drope_pretraining must be one of none, posaug"),
    ({"rope_scaling": "yarn"}, "positions.rope_scaling=yarn scales RoPE, which strategy drope removes"),
    ({"layer_mode": "bottom", "layer_count": 1}, "positions.layer_mode=bottom only applies to strategy posaug"),
])
def test_settings_outside_the_recipe_are_refused_in_one_line(fields, message):
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        PositionConfig(strategy="drope", **fields)
    assert "\n" not in str(error.value)


def test_models_outside_the_recipe_are_refused_in_one_line():
    from megatron_ext.model import ModelConfig

    base = dict(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=WINDOW, vocab_size=64)
    with pytest.raises(ValueError, match="drop model.window_size"):
        ModelConfig(**base, window_size=8, window_attn_skip_freq=2, core_attention="sdpa").check_positions(
            "drope", "none")
    with pytest.raises(ValueError, match="model.position_embedding_type=none: use rope"):
        ModelConfig(**base, position_embedding_type="none").check_positions("drope", "none")


def test_the_tables_rows_name_back_and_use_the_modules_default_share():
    from megatron_ext.positions.drope import DEFAULT_SHARE
    from pretrain.naming import method_name
    from pretrain.table import DROPE_SHARE, METHODS

    assert DROPE_SHARE == DEFAULT_SHARE
    for name in ("drope", "drope_2x", "posaug_drope"):
        assert method_name(PositionConfig(**METHODS[name].position_fields(WINDOW)), WINDOW) == name
