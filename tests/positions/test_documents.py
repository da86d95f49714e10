"""Document masking's positions: every strategy restarts at each EOD and draws per document, layout-free."""

import pytest
import torch

from megatron_ext.positions import PositionConfig, build_sampler
from megatron_ext.positions.documents import Documents, document_index
from megatron_ext.positions.strategies import skew

EOD, S, L = 99, 16, 64
# Row 0: documents of 3, 4, an empty one (EOD alone), then one cut by the window's end.
# Row 1: no EOD: one document longer than the window.
TOKENS = torch.tensor([[1, 2, EOD, 3, 4, 5, EOD, EOD, 6, 7, 8, 9, 10, 11, 12, 13],
                       [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]])
DOCUMENTS = Documents.from_tokens(TOKENS, EOD)
SPANS = {0: [(0, 3), (3, 7), (7, 8), (8, 16)], 1: [(0, 16)]}  # [start, end) of each document

CONFIGS = {
    "none": {},
    "posaug": {"strategy": "posaug"},
    "posaug_per_sample": {"strategy": "posaug", "granularity": "per_sample"},
    "posaug_independent": {"strategy": "posaug", "layer_mode": "independent"},
    "posaug_bottom": {"strategy": "posaug", "layer_mode": "bottom", "layer_count": 1},
    "random_base": {"strategy": "random_base"},
    "rfs_per_step": {"strategy": "rfs", "granularity": "per_step", "max_position": L},
    "rfs_per_sample": {"strategy": "rfs", "max_position": L},
    "rpe": {"strategy": "rpe", "max_position": L},
    "rpe_per_sample": {"strategy": "rpe", "max_position": L, "granularity": "per_sample"},
    "warp": {"strategy": "warp", "p_head": 0.3, "p_tail": 0.5},
}


def sampler(name: str, seed: int = 7):
    return build_sampler(PositionConfig(**CONFIGS[name]), seed=seed, train_seq_len=S, num_layers=2, rotary_dim=8,
                         rotary_base=10000.0, total_steps=10)


def positions(name: str, first_sample: int = 0, documents: Documents = DOCUMENTS, step: int = 3) -> torch.Tensor:
    rope = sampler(name).training(step, S, first_sample=first_sample, batch_size=documents.index.shape[0],
                                  documents=documents)
    return rope.positions if rope.layer_positions is None else rope.layer_positions


def test_a_document_starts_after_every_eod_and_an_empty_one_is_the_eod_alone():
    assert DOCUMENTS.index[0].tolist() == [0, 0, 0, 1, 1, 1, 1, 2, 3, 3, 3, 3, 3, 3, 3, 3]
    assert DOCUMENTS.offsets[0].tolist() == [0, 1, 2, 0, 1, 2, 3, 0, 0, 1, 2, 3, 4, 5, 6, 7]
    assert DOCUMENTS.lengths[0].tolist() == [3] * 3 + [4] * 4 + [1] + [8] * 8
    assert DOCUMENTS.offsets[1].tolist() == list(range(S))


@pytest.mark.parametrize("name", ["none", "posaug", "posaug_per_sample", "random_base", "warp"])
def test_arange_strategies_restart_at_zero_at_every_document(name):
    grid = positions(name)
    for row, spans in SPANS.items():
        for start, _ in spans:
            assert (grid[..., row, start] == 0).all(), (name, row, start)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_window_without_eod_gets_the_plain_positions(name):
    # Row 1's document is longer than the window: the window's part of it, from position 0, as today.
    with_documents = positions(name)[..., 1, :]
    rope = sampler(name).training(3, S, first_sample=0, batch_size=2)
    plain = rope.positions if rope.layer_positions is None else rope.layer_positions
    plain = plain[..., 1, :] if sampler(name).needs_per_sample else plain
    torch.testing.assert_close(with_documents, plain, rtol=0, atol=0)


def test_posaug_uses_the_steps_one_alpha_in_every_document_and_row():
    alpha = sampler("posaug").sample_alpha(3)
    torch.testing.assert_close(positions("posaug"), alpha * DOCUMENTS.offsets.float())


def test_posaug_per_layer_modes_scale_the_offsets_of_every_document():
    alphas = sampler("posaug_independent").sample_layer_alphas(3)
    torch.testing.assert_close(positions("posaug_independent"), alphas.view(-1, 1, 1) * DOCUMENTS.offsets.float())
    bottom = positions("posaug_bottom")
    torch.testing.assert_close(bottom[0], sampler("posaug").sample_alpha(3) * DOCUMENTS.offsets.float())
    torch.testing.assert_close(bottom[1], DOCUMENTS.offsets.float())


@pytest.mark.parametrize("name", ["rfs_per_step", "rfs_per_sample"])
def test_rfs_gives_each_document_its_own_sorted_draws_in_0_to_L(name):
    grid = positions(name)
    assert ((grid >= 0) & (grid < L)).all()
    for row, spans in SPANS.items():
        for start, end in spans:
            document = grid[row, start:end]
            assert torch.equal(document, document.sort().values), (row, start)
    # documents restart: the second document does not continue the first one's sorted draws
    assert not torch.equal(grid[0, :7], grid[0, :7].sort().values)


@pytest.mark.parametrize("name", ["rpe", "rpe_per_sample"])
def test_rpe_gives_each_document_sorted_distinct_integers_disjoint_from_its_windows_other_documents(name):
    grid = positions(name)
    assert torch.equal(grid, grid.round()) and ((grid >= 0) & (grid < L)).all()
    for row, spans in SPANS.items():
        assert len(set(grid[row].tolist())) == S  # disjoint across the window's documents
        for start, end in spans:
            assert torch.equal(grid[row, start:end], grid[row, start:end].sort().values)


def test_warp_draws_each_documents_rule_over_that_documents_length():
    cfg = CONFIGS["warp"]
    sampler_ = build_sampler(PositionConfig(**cfg), seed=7, train_seq_len=S, num_layers=2, rotary_dim=8,
                             rotary_base=10000.0, total_steps=10)
    seen = set()
    for step in range(40):
        grid = sampler_.training(step, S, first_sample=0, batch_size=2, documents=DOCUMENTS).positions
        for row, spans in SPANS.items():
            for start, end in spans:
                n = end - start
                j = torch.arange(n, dtype=torch.float32)
                got = grid[row, start:end]
                tail = n * skew(j / n, "sqrt")
                if torch.allclose(got, tail) and n > 1:
                    seen.add("tail")
                elif torch.equal(got, j):
                    seen.add("identity")
                else:  # head: alpha * j with one alpha for the document
                    alpha = got[1] / j[1] if n > 1 else torch.tensor(0.0)
                    torch.testing.assert_close(got, alpha * j)
                    seen.add("head")
    assert seen == {"tail", "identity", "head"}


@pytest.mark.parametrize("name", ["rfs_per_sample", "rpe_per_sample", "posaug_per_sample", "warp"])
def test_a_sequences_positions_do_not_depend_on_its_microbatch(name):
    four = Documents.from_tokens(torch.cat([TOKENS, TOKENS.flip(-1)]), EOD)
    whole = positions(name, 0, four)
    halves = torch.cat([positions(name, 0, Documents(four.index[:2])), positions(name, 2, Documents(four.index[2:]))],
                       dim=-2)
    torch.testing.assert_close(whole, halves, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["rfs_per_sample", "rpe_per_sample", "warp"])
def test_right_padding_is_its_own_document_and_real_tokens_match_the_lengths_path(name):
    lengths = torch.tensor([5, 11])
    tokens = torch.arange(1, 2 * S + 1).view(2, S)
    documents = Documents.from_tokens(tokens, EOD, lengths)
    assert documents.index.tolist()[0] == [0] * 5 + [1] * 11
    got = positions(name, 0, documents)
    plain = sampler(name).training(3, S, first_sample=0, batch_size=2, lengths=lengths).positions
    for row, n in enumerate(lengths.tolist()):
        torch.testing.assert_close(got[row, :n], plain[row, :n], rtol=0, atol=0)


def test_attention_mask_is_block_diagonal_causal():
    mask = DOCUMENTS.attention_mask()
    assert mask.shape == (2, 1, S, S) and mask.dtype == torch.bool
    seen = ~mask[0, 0]
    index = DOCUMENTS.index[0]
    for i in range(S):
        for j in range(S):
            assert bool(seen[i, j]) == (j <= i and bool(index[i] == index[j]))
    assert torch.equal(mask[1, 0], torch.ones(S, S, dtype=torch.bool).triu(1))


def test_document_index_counts_eod_inputs_before_each_token():
    tokens = torch.tensor([[EOD, EOD, 1, EOD]])
    assert document_index(tokens, EOD).tolist() == [[0, 1, 2, 2]]


def test_documents_cover_the_window_or_are_refused():
    with pytest.raises(ValueError, match="documents cover 15 tokens"):
        sampler("none").training(0, S, first_sample=0, batch_size=2, documents=Documents(DOCUMENTS.index[:, :15]))
