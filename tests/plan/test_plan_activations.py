"""Activation formulas on a hand-worked layer (see pretrain/plan/activations.py for each term)."""

import pytest

from pretrain.plan.activations import Layer, in_flight, layer_bytes, logits_bytes, stage_bytes

# s = 4, b = 2, h = 8, f = 16, 2 heads of 4 channels (q = 8), one KV group (kv = 4), bf16 (a = 2): sb = 8.
HAND = Layer(seq=4, micro_batch=2, hidden=8, ffn=16, heads=2, q_size=8, kv_size=4, act_bytes=2)
# norms 2 × 2a × sbh = 2 × 4 × 64 = 512; attention a·sb·((q+kv) + (q+2kv) + 2q) = 2·8·(12+16+16) = 704;
# log-sum-exp 4·b·heads·s = 64; MLP a·sb·5f = 2·8·80 = 1280
HAND_TE = 512 + 704 + 64 + 1280


def test_transformer_engine_layer_matches_the_hand_count():
    assert layer_bytes(HAND) == HAND_TE == 2560


def test_local_layer_keeps_fp32_norm_copies():
    local = Layer(**{**HAND.__dict__, "impl": "local"})
    assert layer_bytes(local) == 2 * (8 + 2) * 64 + 704 + 64 + 1280


def test_tensor_parallel_splits_all_but_the_norms_without_sequence_parallel():
    tp2 = Layer(**{**HAND.__dict__, "tp": 2})
    assert layer_bytes(tp2) == 512 + (704 + 64 + 1280) / 2


def test_sequence_parallel_splits_the_norms_too():
    sp = Layer(**{**HAND.__dict__, "tp": 2, "sequence_parallel": True})
    assert layer_bytes(sp) == HAND_TE / 2


def test_full_uniform_recompute_keeps_layer_inputs_and_rebuilds_one_layer():
    # 4 layers, one at a time: 4 inputs of a·sbh = 128 bytes, plus one layer rebuilt in the backward pass
    assert stage_bytes(HAND, 4, "full", "uniform", 1) == 4 * 128 + HAND_TE


def test_full_block_recompute_of_two_layers_of_four():
    assert stage_bytes(HAND, 4, "full", "block", 2) == 2 * 128 + 2 * HAND_TE + HAND_TE


def test_selective_recompute_drops_only_the_log_sum_exp_with_flash_attention():
    assert stage_bytes(HAND, 4, "selective") == 4 * (HAND_TE - 64)


@pytest.mark.parametrize("pp,stage,microbatches,vp,expected",
                         [(1, 0, 8, None, 1), (4, 0, 8, None, 4), (4, 3, 8, None, 1), (4, 0, 2, None, 2),
                          (4, 0, 8, 2, 5.5)])
def test_micro_batches_in_flight_follow_1f1b_and_megatrons_interleaving_factor(pp, stage, microbatches, vp, expected):
    assert in_flight(pp, stage, microbatches, vp) == expected


def test_logits_keep_fp32_softmax_and_the_16_bit_logits():
    # final norm 2a·sbh = 256; vocab 32: (4 + 2)·sb·V = 6·8·32 = 1536; labels and mask 9·sb = 72
    assert logits_bytes(HAND, 32) == 256 + 1536 + 72
