"""Document masking inside Megatron-Core: the block-diagonal causal mask (SDPA and Megatron's attention) and
the THD path of the RoPE hook (per-token angles from packed_seq_params)."""

import pytest
import torch

from megatron_ext.model import build_model  # first: megatron_ext.cpu_compat lets megatron-core import on CPU
from megatron_ext.positions import PositionConfig, RopePositions, build_sampler
from megatron_ext.positions.documents import Documents
from pretrain.table import model_preset as preset

EOD, S = 255, 24
# Row 0: documents [0, 5), [5, 6) (an empty one: the EOD alone), [6, 15), [15, 24); row 1: one document.
TOKENS = torch.randint(0, 200, (2, S), generator=torch.Generator().manual_seed(3))
TOKENS[0, [4, 5, 14]] = EOD
DOCUMENTS = Documents.from_tokens(TOKENS, EOD)


def _build(core_attention: str = "sdpa", **fields) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(preset("tiny", core_attention=core_attention, **fields), per_sample_positions=True).eval()


def _logits(model, tokens, positions, mask) -> torch.Tensor:
    with torch.no_grad():
        return model(tokens, positions, mask)


def _rfs_positions(documents: Documents) -> RopePositions:
    sampler = build_sampler(PositionConfig(strategy="rfs", max_position=256), seed=1, train_seq_len=S, num_layers=2,
                            rotary_dim=16, rotary_base=10000.0, total_steps=4)
    return sampler.training(1, S, first_sample=0, batch_size=2, documents=documents)


@pytest.mark.parametrize("core_attention, fields", [("sdpa", {}), ("megatron", {}),
                                                    ("sdpa", {"position_embedding_type": "alibi"}),
                                                    ("sdpa", {"position_embedding_type": "none"})],
                         ids=["sdpa", "megatron", "alibi", "nope"])
def test_a_tokens_logits_do_not_change_when_another_documents_tokens_change(megatron_world, core_attention, fields):
    model = _build(core_attention, **fields)
    positions = DOCUMENTS.offsets.float()
    before = _logits(model, TOKENS, positions, DOCUMENTS.attention_mask())
    changed = TOKENS.clone()
    changed[0, 6:14] = torch.randint(0, 200, (8,), generator=torch.Generator().manual_seed(9))  # the third document
    after = _logits(model, changed, positions, DOCUMENTS.attention_mask())
    outside = torch.ones(S, dtype=torch.bool)
    outside[6:15] = False
    torch.testing.assert_close(after[0, outside], before[0, outside], rtol=0, atol=1e-6)
    assert not torch.allclose(after[0, 6:15], before[0, 6:15])
    torch.testing.assert_close(after[1], before[1], rtol=0, atol=1e-6)


@pytest.mark.parametrize("core_attention", ["sdpa", "megatron"])
def test_document_masked_logits_equal_each_document_run_alone(megatron_world, core_attention):
    model = _build(core_attention)
    together = _logits(model, TOKENS, DOCUMENTS.offsets.float(), DOCUMENTS.attention_mask())
    for start, end in [(0, 5), (5, 6), (6, 15), (15, 24)]:
        alone = _logits(model, TOKENS[:1, start:end], torch.arange(end - start, dtype=torch.float32), None)
        torch.testing.assert_close(together[:1, start:end], alone, rtol=1e-5, atol=1e-5)


def test_sdpa_mask_path_equals_megatrons_masked_attention_in_logits_and_gradients(megatron_world):
    positions = _rfs_positions(DOCUMENTS)
    results = []
    for core_attention in ("megatron", "sdpa"):
        model = _build(core_attention).train()
        logits = model(TOKENS, positions, DOCUMENTS.attention_mask())
        (logits.float() ** 2).mean().backward()
        results.append((logits.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(results[1][1], results[0][1], rtol=1e-4, atol=1e-6)


def test_sdpa_takes_the_mask_without_falling_back_to_megatrons_path(megatron_world, monkeypatch):
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    def refuse(*args, **kwargs):
        raise AssertionError("Megatron's unfused attention ran")

    monkeypatch.setattr(DotProductAttention, "forward", refuse)
    _logits(_build("sdpa"), TOKENS, DOCUMENTS.offsets.float(), DOCUMENTS.attention_mask())


def _packed(documents: Documents):
    """THD parameters of the microbatch's documents, packed row after row."""
    from megatron.core.packed_seq_params import PackedSeqParams

    lengths = [int(n) for row in range(documents.index.shape[0])
               for n in torch.unique_consecutive(documents.index[row], return_counts=True)[1]]
    cu_seqlens = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu_seqlens, cu_seqlens_kv=cu_seqlens,
                           max_seqlen_q=max(lengths), max_seqlen_kv=max(lengths))


def test_thd_per_token_angles_equal_the_bshd_paths_angles(megatron_world):
    model = _build()
    rope = _rfs_positions(DOCUMENTS)  # [b, s], restarting per document
    bshd = model.rotary_angles_for(rope)  # [s, b, 1, d]
    thd = model.packed_rotary_angles_for(RopePositions(rope.positions.reshape(1, -1)), _packed(DOCUMENTS))
    assert thd.shape == (2 * S, 1, 1, bshd.shape[-1])
    torch.testing.assert_close(thd, bshd.transpose(0, 1).reshape(2 * S, 1, 1, -1), rtol=0, atol=0)


def test_megatrons_thd_rope_applies_the_per_token_angles_as_the_bshd_path_does(megatron_world):
    from megatron.core import parallel_state
    from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb

    model = _build()
    rope = _rfs_positions(DOCUMENTS)
    packed = _packed(DOCUMENTS)
    d = model.config.kv_channels
    query = torch.randn(S, 2, 4, d, generator=torch.Generator().manual_seed(5))  # [s, b, heads, d]
    bshd = apply_rotary_pos_emb(query, model.rotary_angles_for(rope), model.config)
    thd = apply_rotary_pos_emb(query.transpose(0, 1).reshape(2 * S, 4, d),
                               model.packed_rotary_angles_for(RopePositions(rope.positions.reshape(-1)), packed),
                               model.config, cu_seqlens=packed.cu_seqlens_q,
                               cp_group=parallel_state.get_context_parallel_group())
    torch.testing.assert_close(thd, bshd.transpose(0, 1).reshape(2 * S, 4, d), rtol=0, atol=1e-6)


def test_thd_preprocess_hands_megatron_per_token_angles(megatron_world):
    model = _build()
    rope = _rfs_positions(DOCUMENTS)
    output = model._preprocess(TOKENS.reshape(1, -1), RopePositions(rope.positions.reshape(1, -1)),
                               packed_seq_params=_packed(DOCUMENTS))
    torch.testing.assert_close(output[1], model.rotary_angles_for(rope).transpose(0, 1).reshape(2 * S, 1, 1, -1))


def test_thd_accepts_one_shared_row_for_shared_alpha_strategies(megatron_world):
    model = _build()
    row = torch.arange(S, dtype=torch.float32) * 2.5  # PosAug: every document uses alpha * (i - start)
    angles = model.packed_rotary_angles_for(RopePositions(row), _packed(DOCUMENTS))
    torch.testing.assert_close(angles, model.rotary_angles_for(RopePositions(row)))


def test_thd_refuses_positions_that_cover_neither_the_tokens_nor_the_longest_sequence(megatron_world):
    with pytest.raises(ValueError, match="must cover every packed token"):
        _build().packed_rotary_angles_for(RopePositions(torch.arange(5.0)), _packed(DOCUMENTS))


def test_thd_refuses_per_token_angles_with_fused_rope(megatron_world):
    model = _build()
    model.config.apply_rope_fusion = True
    try:
        with pytest.raises(ValueError, match="apply_rope_fusion=False"):
            model.packed_rotary_angles_for(RopePositions(torch.zeros(2 * S)), _packed(DOCUMENTS))
    finally:
        model.config.apply_rope_fusion = False


def test_packed_params_in_another_format_are_refused(megatron_world):
    from megatron.core.packed_seq_params import PackedSeqParams

    packed = PackedSeqParams(qkv_format="sbhd")
    with pytest.raises(ValueError, match="qkv_format='thd'"):
        _build().packed_rotary_angles_for(RopePositions(torch.arange(float(S))), packed)


def test_sdpa_inverts_the_mask_once_per_microbatch_for_every_layer(megatron_world, monkeypatch):
    from megatron_ext import sdpa_attention

    masks = []
    original = sdpa_attention.F.scaled_dot_product_attention

    def recording(*args, attn_mask=None, **kwargs):
        masks.append(attn_mask)
        return original(*args, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(sdpa_attention.F, "scaled_dot_product_attention", recording)
    model = _build("sdpa")
    _logits(model, TOKENS, DOCUMENTS.offsets.float(), DOCUMENTS.attention_mask())
    assert len(masks) == model.config.num_layers >= 2
    assert all(mask is masks[0] for mask in masks)
    assert torch.equal(masks[0], ~DOCUMENTS.attention_mask())
