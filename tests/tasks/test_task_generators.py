"""Task generators: the papers' examples, format, determinism, sizes, CLI. Runtime: ~2 s."""

import random
import subprocess
import sys

import pytest

from pretrain.tasks.generators import (BOS, EOS, SEP, TASKS, VOCAB, VOCAB_SIZE, example_at, generate, get_task,
                                       solve)

REPO = __import__("pathlib").Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("task, prompt, answer", [
    # RFS paper, Table 4 (word tokens replaced by our symbols where the task copies words).
    ("addition", "Compute 3 5 3 2 + 6 2 7 6 5 4 ?", "The answer is 6 3 1 1 8 6 ."),
    ("sort", "Sort the following list [ 9 8 3 0 , 5 1 5 ] .", "The sorted list is [ 5 1 5 , 9 8 3 0 ] ."),
    ("summation", "Compute : 3 + 9 + 2 + 1 + 7 .", "The answer is 2 ."),
    ("copy", "Copy : c b s 8", "c b s 8"),
    ("copy2", "Copy : a a a", "a a a"),
    ("reverse", "s c b 8", "8 b c s"),
    # Delétang et al. / Ruoss et al.
    ("duplicate", "0 1 1", "0 1 1 0 1 1"),
    ("missing_duplicate", "0 1 _ 0 1 1", "1"),
    ("missing_duplicate", "_ 1 0 1", "0"),
])
def test_solver_gives_the_papers_answers(task, prompt, answer):
    assert solve(task, prompt) == answer


def test_sort_orders_numerically_not_lexically():
    assert solve("sort", "Sort the following list [ 1 0 , 9 , 1 0 0 ] .") == "The sorted list is [ 9 , 1 0 , 1 0 0 ] ."


@pytest.mark.parametrize("task", list(TASKS))
def test_examples_are_bos_prompt_sep_answer_eos_in_the_vocabulary(task):
    rng = random.Random(0)
    for length in range(TASKS[task].min_length, 12):
        example = generate(task, length, rng)
        ids = example.ids()
        assert ids[0] == BOS and ids[example.answer_start - 1] == SEP and ids[-1] == EOS
        assert ids[example.answer_start:-1] == [VOCAB.index(t) for t in example.answer]
        assert all(0 <= i < VOCAB_SIZE for i in ids)
        assert list(example.answer) == TASKS[task].solve(list(example.prompt))


@pytest.mark.parametrize("task", list(TASKS))
def test_no_example_is_longer_than_max_tokens(task):
    rng = random.Random(1)
    for length in range(TASKS[task].min_length, 30):
        assert max(len(generate(task, length, rng).ids()) for _ in range(50)) <= TASKS[task].max_tokens(length)


@pytest.mark.parametrize("task, length, size", [
    ("copy", 5, 5), ("reverse", 7, 7), ("duplicate", 4, 4), ("missing_duplicate", 3, 6), ("summation", 4, 4)])
def test_length_counts_the_papers_problem_size(task, length, size):
    example = generate(task, length, random.Random(2))
    counted = {"copy": len(example.prompt) - 2, "reverse": len(example.prompt), "duplicate": len(example.prompt),
               "missing_duplicate": len(example.prompt), "summation": example.prompt.count("+") + 1}[task]
    assert counted == size


def test_addition_length_is_the_total_number_of_operand_digits():
    for length in (2, 5, 9):
        example = generate("addition", length, random.Random(length))
        assert sum(t.isdigit() for t in example.prompt) == length


def test_sort_length_is_the_number_of_list_items():
    example = generate("sort", 6, random.Random(3))
    assert example.prompt.count(",") == 5


def test_example_at_is_a_pure_function_of_seed_split_and_index():
    first = [example_at("copy", 7, "train", i, 1, 20) for i in range(20)]
    again = [example_at("copy", 7, "train", i, 1, 20) for i in reversed(range(20))][::-1]
    assert first == again
    assert first != [example_at("copy", 8, "train", i, 1, 20) for i in range(20)]
    assert first != [example_at("copy", 7, "valid", i, 1, 20) for i in range(20)]


def test_lengths_below_the_tasks_minimum_are_rejected():
    with pytest.raises(ValueError, match="length >= 2"):
        generate("addition", 1, random.Random(0))


def test_unknown_task_names_the_choices():
    with pytest.raises(ValueError, match="copy, copy2, reverse"):
        get_task("parity")


def test_cli_prints_one_line_per_example(capsys):
    from pretrain.tasks.__main__ import main

    assert main(["generate", "--task", "reverse", "--length", "3", "--count", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(line.startswith("[3] ") for line in lines)


def test_cli_rejects_a_bad_task_with_one_line_and_exit_code_2():
    env = {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": ""}
    bad = subprocess.run([sys.executable, "-m", "pretrain.tasks", "generate", "--task", "parity", "--length", "3"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0
    assert "--task 'parity'" in bad.stderr and "Traceback" not in bad.stderr
