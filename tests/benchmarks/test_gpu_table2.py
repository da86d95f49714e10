"""The Table 2 row's command (benchmarks/gpu_table2.py, table2_report.py, table2_data.py): the budget fitted to a
rate and a deadline, the merge of one-seed reports, the data pack's round trip, and the cpu-tiny dry run of the
whole command (benchmarks/gpu_table2.sh)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_table2  # noqa: E402
import table2_data  # noqa: E402
import table2_report  # noqa: E402

STEP = 128 * 2048  # gpu-10m: global batch 128 x w 2048


def test_a_budget_that_fits_trains_the_full_500m_and_says_so():
    budget = gpu_table2.fit_budget(rate=1.5e6, seconds=800, step_tokens=STEP, target_tokens=500_000_000)
    assert budget.full and budget.steps == 500_000_000 // STEP
    assert budget.first_line.startswith("Budget: the full 500,000,000 tokens per run")


def test_a_budget_that_does_not_fit_trains_the_largest_equal_budget_and_says_short_in_the_first_line():
    budget = gpu_table2.fit_budget(rate=1.5e6, seconds=400, step_tokens=STEP, target_tokens=500_000_000)
    assert not budget.full
    assert budget.steps * STEP * 2 <= 1.5e6 * 400 * gpu_table2.SAFETY < (budget.steps + 1) * STEP * 2
    assert budget.first_line.startswith(f"Budget SHORT of the full 500,000,000 tokens per run: {budget.tokens:,} each")
    assert "the full budget needs ~784 s" in budget.first_line


def test_a_deadline_too_close_for_twenty_steps_trains_nothing_and_says_so():
    budget = gpu_table2.fit_budget(rate=1.5e6, seconds=5, step_tokens=STEP, target_tokens=500_000_000)
    assert budget.steps < gpu_table2.MIN_STEPS and budget.first_line.startswith("Nothing trained: only")


def record(label: str, seed: int, in_dist: float, ood: float, gain: float, spans: int = 4) -> dict:
    """An evaluation record of the shape reproduce.evaluate_run writes (eval length 128)."""
    ins = [in_dist + 0.01 * i for i in range(spans)]
    oods = [ood + 0.02 * i for i in range(spans)]
    mean_in, mean_ood = sum(ins) / spans, sum(oods) / spans
    return {"label": label, "seed": seed, "lengths": {"128": {"cliff": {"in_dist": mean_in, "ood": mean_ood,
                                                                         "cliff": mean_ood - mean_in}}},
            "per_span": {"in_dist": ins, "ood": oods}, "context_gain": {"values": {"128": gain}}}


def one_seed(seed: int, shift: float, tokens: int = 8192) -> dict:
    return {"first_line": f"Budget: the full {tokens:,} tokens per run (16 steps), both runs.", "preset": "cpu-tiny",
            "window": 32, "eval_length": 128, "num_spans": 4, "gain_spans": 4, "train_tokens": tokens,
            "steps": 16, "target_tokens": 8192, "seeds": [seed], "device": "cpu",
            "data": {"corpus": "c", "documents": 3, "vocab_size": 512, "train_tokens": 4096, "valid_tokens": 999},
            "records": [record("baseline", seed, 4.0 + shift, 6.0 + shift, -0.3),
                        record("posaug", seed, 4.1 + shift, 4.2 + shift, 2.0 + shift)]}


def test_two_one_seed_reports_merge_into_one_table_with_seed_ses(tmp_path):
    for seed, shift in ((42, 0.0), (137, 0.2)):
        table2_report.write(tmp_path / str(seed), one_seed(seed, shift))
    code = table2_report.main(["merge", str(tmp_path / "42"), str(tmp_path / "137"), "--output", str(tmp_path / "m")])
    report = (tmp_path / "m" / "report.md").read_text()
    assert code == 0 and report.startswith("2 seeds (42, 137) of one budget")
    posaug = next(line for line in report.splitlines() if line.startswith("| ours (mean ± SE over 2 seeds) | posaug"))
    assert "| 2.100 ± 0.100 |" in posaug  # G: seeds 2.0 and 2.2, SE = sd / sqrt(2) = 0.1
    assert "- seed 42:" in report and "- seed 137:" in report
    assert "each seen ~2.00 times per run" in report


def test_reports_of_different_budgets_are_not_merged(tmp_path):
    table2_report.write(tmp_path / "a", one_seed(42, 0.0))
    table2_report.write(tmp_path / "b", one_seed(137, 0.0, tokens=4096))
    result = subprocess.run([sys.executable, str(REPO / "benchmarks/table2_report.py"), "merge", str(tmp_path / "a"),
                             str(tmp_path / "b"), "--output", str(tmp_path / "m")], capture_output=True, text=True)
    assert result.returncode == 2 and "differ in train_tokens (8192 vs 4096)" in result.stderr


def test_the_same_seed_twice_is_not_merged():
    with pytest.raises(table2_report.MergeError, match="appears twice"):
        table2_report.merge([one_seed(42, 0.0), one_seed(42, 0.1)])


def test_the_report_opens_with_the_budget_line_and_shows_the_papers_row(tmp_path):
    report = table2_report.write(tmp_path, one_seed(42, 0.0)).read_text()
    assert report.splitlines()[0] == "Budget: the full 8,192 tokens per run (16 steps), both runs."
    assert "| paper, Table 2 (10.6M, 500M tokens) | posaug | 0.060 | 2.042 | 4.160 | 1.8 % | +2.34 |" in report


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    """A small real-text pack (the embedded corpus), built as on the CPU side."""
    root = tmp_path_factory.mktemp("table2")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-m", "data_prep", "embedded-corpus", "--output", str(root / "docs"),
                    "--max-bytes", "150000"], check=True, env=env, capture_output=True)
    # 400 tokens, not cpu-tiny's 512: the command takes the vocabulary from the pack
    info = table2_data.pack(root / "docs", root / "pack", 400, root / "here", valid_fraction=0.25)
    return root, info


@pytest.mark.slow
def test_the_pack_tokenized_elsewhere_gives_the_shards_built_here_and_a_changed_part_is_refused(pack):
    root, info = pack
    prefix = table2_data.unpack(root / "pack", root / "there", workers=1)
    assert table2_data.shard_digests(prefix) == table2_data.shard_digests(root / "here" / "shards" / "corpus")
    assert info["train_tokens"] > 0 and info["valid_tokens"] > 0
    tampered = root / "tampered"
    subprocess.run(["cp", "-r", str(root / "pack"), str(tampered)], check=True)
    import zstandard

    part = tampered / "corpus" / "part-00.jsonl.zst"
    text = zstandard.ZstdDecompressor().decompress(part.read_bytes(), max_output_size=2**28)
    part.write_bytes(zstandard.ZstdCompressor().compress(text + b'{"text": "a document added after packing"}\n'))
    with pytest.raises(table2_data.PackError, match="differ from those built where it was packed"):
        table2_data.unpack(tampered, root / "there2", workers=1)


@pytest.mark.slow
@pytest.mark.e2e
def test_the_cpu_tiny_dry_run_of_the_command_trains_both_evaluates_and_reports(pack, tmp_path):
    root, _ = pack
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": sys.executable}
    result = subprocess.run(["bash", "benchmarks/gpu_table2.sh", "500", "500", "--preset", "cpu-tiny", "--pack",
                             str(root / "pack"), "--shards", str(tmp_path / "shards"), "--output",
                             str(tmp_path / "run"), "--workers", "2", "--tokens-per-s", "1000000"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:]
    report = (tmp_path / "out" / "report.md").read_text()
    assert report.startswith("Budget: the full 8,192 tokens per run (16 steps), both runs")
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert sorted(r["label"] for r in results["records"]) == ["baseline", "posaug"]
    assert all(r["context_gain"]["num_spans"] == gpu_table2.GAIN_SPANS for r in results["records"])
    assert results["reached"] == {"baseline_s42": 16, "posaug_s42": 16}
    assert "vocab_size: 400" in (tmp_path / "run" / "configs" / "baseline_s42.yaml").read_text()


def test_a_long_dictionary_text_is_cut_into_documents_at_blank_lines_or_else_at_line_ends():
    import table2_corpus

    assert table2_corpus.chunks("a\n\nbb\n\ncc", size=2) == ["a\n\nbb", "cc"]
    assert table2_corpus.chunks("aaa\nbbb\nccc", size=3) == ["aaa", "bbb", "ccc"]


def test_an_html_page_gives_its_visible_text_only(tmp_path):
    import table2_corpus

    page = tmp_path / "p.html"
    page.write_text("<html><head><title>T</title></head><body><script>x()</script><p>Hello</p>\n\n\n<p>world</p>")
    assert table2_corpus.html_text(page) == "Hello\n\nworld"
