"""TaskSource: the trainer's sample contract, loss mask on the answer only, lengths U{a..N}. Runtime: ~2 s."""

import math
from collections import Counter

import pytest
import torch

from pretrain.tasks.generators import EOS, PAD, decode
from pretrain.tasks.source import TaskSource, evaluation_examples, pack, sequence_tokens


def test_samples_are_seq_length_tensors_the_trainer_stacks():
    source = TaskSource("sort", 1, 4, sequence_tokens("sort", 4), seed=0)
    sample = source[123]
    assert set(sample) == {"tokens", "labels", "loss_mask", "position_length"}
    assert all(sample[key].shape == (source.seq_length,) for key in ("tokens", "labels", "loss_mask"))
    assert sample["tokens"].dtype == torch.long and sample["loss_mask"].dtype == torch.float32


@pytest.mark.parametrize("task", ["copy", "addition", "sort", "missing_duplicate"])
def test_loss_mask_covers_exactly_the_answer_tokens_and_eos(task):
    source = TaskSource(task, 2, 6, 80, seed=1)
    for index in range(20):
        example, sample = source.example(index), source[index]
        masked = sample["labels"][sample["loss_mask"].bool()].tolist()
        assert decode(masked) == [*example.answer, "<eos>"]


def test_position_length_is_the_examples_number_of_inputs_before_the_padding():
    source = TaskSource("copy", 1, 6, sequence_tokens("copy", 6), seed=0)
    for index in range(20):
        example, sample = source.example(index), source[index]
        length = sample["position_length"]
        assert length.shape == () and length.dtype == torch.long
        assert length.item() == len(example.ids()) - 1
        assert torch.all(sample["tokens"][length:] == PAD) and sample["tokens"][length - 1] != PAD


def test_labels_are_the_tokens_shifted_by_one_and_padding_is_unmasked():
    source = TaskSource("reverse", 3, 3, 20, seed=0)
    sample, ids = source[0], source.example(0).ids()
    assert sample["tokens"][: len(ids) - 1].tolist() == ids[:-1]
    assert sample["labels"][: len(ids) - 1].tolist() == ids[1:]
    assert (sample["tokens"][len(ids) - 1:] == PAD).all()
    assert sample["loss_mask"][len(ids) - 1:].sum() == 0
    assert sample["labels"][len(ids) - 2] == EOS


def test_same_index_gives_the_same_sample_and_other_seeds_differ():
    a, b = TaskSource("copy", 1, 20, 45, seed=3), TaskSource("copy", 1, 20, 45, seed=3)
    assert all(torch.equal(a[i]["tokens"], b[i]["tokens"]) for i in (0, 7, 10 ** 9))
    other = TaskSource("copy", 1, 20, 45, seed=4)
    assert any(not torch.equal(a[i]["tokens"], other[i]["tokens"]) for i in range(5))


def test_training_lengths_are_uniform_over_min_to_max():
    source = TaskSource("copy", 2, 6, 20, seed=0)
    counts = Counter(source.example(i).length for i in range(5000))
    assert set(counts) == {2, 3, 4, 5, 6}
    expected, sd = 1000, math.sqrt(5000 * 0.2 * 0.8)
    assert all(abs(c - expected) < 5 * sd for c in counts.values())


def test_seq_length_too_short_for_the_longest_example_names_the_fix():
    with pytest.raises(ValueError, match="model.seq_length >= 44"):
        TaskSource("copy", 1, 20, 30, seed=0)
    with pytest.raises(ValueError, match="raise model.seq_length"):
        pack(evaluation_examples("copy", 20, 1, 0)[0], 30)


def test_evaluation_examples_have_the_requested_length_and_differ_from_training():
    examples = evaluation_examples("reverse", 9, 50, seed=0)
    assert {e.length for e in examples} == {9}
    train = {TaskSource("reverse", 9, 9, 30, seed=0).example(i) for i in range(50)}
    assert not train & set(examples)


# ---- the trainer's seam (issue 43): it knows task data only through the source pretrain.tasks registers


def test_the_trainer_takes_task_data_from_the_registered_source():
    from types import SimpleNamespace

    import pretrain.tasks  # noqa: F401  registers
    from pretrain.trainer.data import task_source

    data = SimpleNamespace(task="copy", task_min_length=1, task_max_length=5)
    train, valid = task_source().datasets(data, 64, 0)
    assert isinstance(train, TaskSource) and (train.split, valid.split) == ("train", "valid")
    assert task_source().eod == EOS
    with pytest.raises(ValueError, match="vocab_size"):
        task_source().check(data, SimpleNamespace(vocab_size=2, seq_length=64))


def test_importing_the_task_package_registers_without_torch():
    import subprocess
    import sys

    from conftest import REPO

    code = ("import sys\nimport pretrain.tasks\nfrom pretrain.trainer.task_data import task_source\n"
            "task_source()\nprint('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "False", proc.stderr


def test_a_task_config_without_a_registered_source_names_how_to_register_it():
    import subprocess
    import sys

    from conftest import REPO

    code = ("from pretrain.trainer import config\n"
            "try:\n    config.load(None, ['preset=tiny', 'data.task=copy', 'model.vocab_size=64']).validate(1)\n"
            "except ValueError as error:\n    print(error)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert "no task data source is registered" in proc.stdout and "import pretrain.tasks" in proc.stdout, proc.stderr
    assert "pretrain.tasks" not in subprocess.run(
        [sys.executable, "-c", "import sys; from pretrain.trainer import config, loop; print(sorted(sys.modules))"],
        cwd=REPO, capture_output=True, text=True, timeout=120).stdout
