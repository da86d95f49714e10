"""The peak MFU is measured against: from the config, or measured at the model's shapes and cached per machine."""

import json

import torch

from megatron_ext.model import ModelConfig
from pretrain.trainer.peak import CACHE_FILE, cache_key, device_peak, forget, model_shapes, plausible_mfu

MODEL = ModelConfig(hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, seq_length=32, vocab_size=256)


def test_a_measured_peak_is_cached_with_its_date_and_load_and_reused(tmp_path):
    first = device_peak(None, MODEL, micro_batch_size=2, directory=tmp_path)
    second = device_peak(None, MODEL, micro_batch_size=2, directory=tmp_path)
    assert first.source == "measured now" and first.tflops > 0
    assert second.source == "cached" and second.tflops == first.tflops and second.measured_at == first.measured_at
    assert second.describe().startswith(f"cached from {first.measured_at}: ")
    entry = json.loads((tmp_path / CACHE_FILE).read_text())[first.key]
    assert set(entry) == {"tflops", "measured_at", "load_average", "detail"}


def test_the_cache_key_names_machine_torch_dtype_threads_and_shapes():
    key = cache_key(torch.float32, [(64, 64, 128)])
    assert f"torch {torch.__version__}" in key and "fp32" in key and "64x64x128" in key
    assert f"{torch.get_num_threads()} threads" in key
    assert cache_key(torch.bfloat16, [(64, 64, 128)]) != key


def test_a_configured_peak_is_used_as_given_and_nothing_is_measured(tmp_path):
    peak = device_peak(123.0, MODEL, directory=tmp_path)
    assert (peak.tflops, peak.source) == (123.0, "config")
    assert peak.describe() == "from the config: logging.peak_tflops"
    assert not (tmp_path / CACHE_FILE).exists()


def test_a_forgotten_peak_is_measured_again(tmp_path):
    peak = device_peak(None, MODEL, directory=tmp_path)
    assert forget(peak, tmp_path)
    assert device_peak(None, MODEL, directory=tmp_path).source == "measured now"


def test_a_damaged_cache_file_is_measured_again_and_rewritten(tmp_path):
    (tmp_path / CACHE_FILE).write_text("{not json")
    peak = device_peak(None, MODEL, directory=tmp_path)
    assert peak.source == "measured now"
    assert peak.key in json.loads((tmp_path / CACHE_FILE).read_text())


def test_a_cache_that_cannot_be_written_is_named_on_the_peak_line_and_the_run_goes_on(tmp_path):
    blocked = tmp_path / "not_a_directory"
    blocked.write_text("a file where the cache directory should be")
    peak = device_peak(None, MODEL, directory=blocked)
    assert peak.source == "measured now" and peak.tflops > 0 and peak.key is None
    assert "not cached: " in peak.describe() and str(blocked / CACHE_FILE) in peak.describe()
    assert blocked.read_text() == "a file where the cache directory should be"


def test_the_measured_shapes_are_the_models_gemms_per_tensor_parallel_rank():
    assert model_shapes(MODEL, micro_batch_size=2) == [(64, 64, 128), (64, 128, 64), (64, 64, 256)]
    assert model_shapes(MODEL, micro_batch_size=2, tensor_parallel=2) == [(64, 64, 64), (64, 64, 64), (64, 64, 128)]


def test_an_mfu_above_100_percent_is_not_plausible():
    assert plausible_mfu(0.42) and plausible_mfu(1.0)
    assert not plausible_mfu(1.01) and not plausible_mfu(-0.1) and not plausible_mfu(float("nan"))


def test_a_cpu_peak_timed_at_a_load_above_the_cores_says_so(tmp_path, monkeypatch):
    import os

    from pretrain.trainer import peak as peak_module

    monkeypatch.setattr(peak_module.os, "getloadavg", lambda: (4.0 * (os.cpu_count() or 1), 0.0, 0.0))
    loaded = device_peak(None, MODEL, directory=tmp_path)
    assert loaded.under_load == f"timed at load average {4.0 * (os.cpu_count() or 1):.1f} on {os.cpu_count()} cores"
    monkeypatch.setattr(peak_module.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert device_peak(None, MODEL, directory=tmp_path / "quiet").under_load is None


def test_an_impossible_mfu_against_a_peak_timed_under_load_is_a_note_not_a_warning(capsys):
    from pretrain.console import Progress
    from pretrain.trainer.metrics import Metrics
    from pretrain.trainer.peak import Peak

    metrics = object.__new__(Metrics)  # only what Metrics.mfu reads: building one starts a run directory
    metrics.peak = Peak(1e-9, "measured now", under_load="timed at load average 16.0 on 2 cores")
    metrics.mfu_dropped, metrics.flops_per_token, metrics.world, metrics.rank = False, 1e6, 1, 0
    metrics.progress = Progress(1, enabled=False)
    assert metrics.mfu(1000.0) is None and metrics.mfu_dropped
    out = capsys.readouterr().out
    assert "warning" not in out and out.startswith("MFU not reported from here: its peak was timed at load average")
