"""The validation split against the evaluation it must feed: `data_prep build`'s closing report says what its
validation tokens allow (even with --no-progress), and `eval`'s refusal of too little data names the fixes."""

from __future__ import annotations

import pytest

from data_prep.summary import EVAL_SPANS, EVAL_WINDOWS, SHIPPED_WINDOW, validation_line
from test_data_prep_helpers import make_docs, run_cli, train_bytelevel, write_jsonl


@pytest.fixture(scope="module")
def small_build(tmp_path_factory):
    """A real `data_prep build --no-progress` process on a 60-document corpus, 2 validation documents."""
    root = tmp_path_factory.mktemp("valid_split")
    tok = train_bytelevel(str(root / "tok"))
    corpus = write_jsonl(str(root / "corpus.jsonl"), make_docs(60, seed=5))
    proc = run_cli(["build", "--input", corpus, "--tokenizer", tok, "--data-prefix", str(root / "shards" / "c"),
                    "--num-shards", "1", "--valid-docs", "2", "--no-progress"], timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.slow  # a real eval / build (seconds quiet, a minute loaded)
def test_no_progress_still_prints_the_closing_summary(small_build):
    assert "done in " in small_build.stderr and "58 train in 1 shard(s), 2 valid" in small_build.stderr


@pytest.mark.slow  # a real eval / build (seconds quiet, a minute loaded)
def test_a_validation_split_too_small_for_the_default_evaluation_says_so_and_names_the_fixes(small_build):
    line = next(line for line in small_build.stderr.splitlines() if line.startswith("validation: 2 document(s)"))
    assert "= 0 span(s) of 16,384" in line and "default 20 spans at 8w need 327,680 tokens" in line
    assert "--valid-docs N" in line and "--data FILE.jsonl" in line


def test_a_validation_split_large_enough_says_so():
    assert validation_line(300, 400_000).endswith("enough for eval run's default 20 spans of 16,384 "
                                                  "(8 × the shipped window)")


def test_the_report_sizes_the_evaluation_that_eval_run_and_the_shipped_configs_default_to():
    from pretrain.evaluation.arguments import eval_parser
    from pretrain.table import EXTRAPOLATION
    from pretrain.trainer.config import CONFIG_DIR, load

    run = eval_parser().parse_args(["run", "m", "--data", "d"])
    assert (EVAL_SPANS, EVAL_WINDOWS) == (run.num_spans, EXTRAPOLATION)
    assert {load(path).model.seq_length for path in CONFIG_DIR.glob("*.yaml")} == {SHIPPED_WINDOW}


def test_evals_refusal_of_too_little_data_names_valid_docs_and_held_out_jsonl():
    import numpy as np

    from pretrain.evaluation.data import eval_spans

    with pytest.raises(ValueError, match=r"--valid-docs N.*--data FILE\.jsonl"):
        eval_spans(np.arange(100), num_spans=20, length=64)
