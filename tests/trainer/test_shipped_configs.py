"""The shipped configs themselves (issue 42): every pretrain/configs/*.yaml, read by the project's own loader, runs
on CPU with only what a CPU cannot run swapped: two steps and a save, a resume to step 3, and `export-hf`, with bf16,
the distributed optimizer, the positions and the model options as shipped.

The swaps (SWAPS, each with its reason) are Transformer Engine -> local layers and the size: the size row of
pretrain/table.py (model dims, window, vocabulary, batch, token budget, lr schedule numbers) becomes the tiny test
size of tests/conftest.py (TINY_TRAIN), the run length becomes 3 steps with a save every 2, and the data
synthetic tokens (the shipped data.data_path is null: the user names their data). Everything else stays as shipped,
which test_the_cpu_swaps_are_the_only_difference_from_each_shipped_yaml checks field by field against the yaml.
The method fields that pretrain/table.py states in windows (positions.max_position = 8 windows, the iRoPE
temperature floor, the SSMax scale 1/log w) shrink with the window by the table's own rules: kept at the 2048
window, an RFS export at w = 32 would be refused (its evaluation length 8w is below max_position).

Once shrunk, the five sizes of a method are one config, so each distinct shrunk config runs once, named after the
yamls it covers. Each runs in one process, the distributed optimizer on its one shard, as the 10m launchers' one
GPU runs it. PosAug's runs on 2 gloo ranks (DP=2, the sharded path the 42m-1b launchers take at DP >= 4); that every
method's positions and model options train alike under DP=2, TP=2 and PP=2 is tests/trainer/
test_parallel_equivalence.py's, and the sharded save and resume tests/trainer/test_distributed_optimizer.py's.

The resume is checked bit for bit: the uninterrupted run saves at step 2 and runs on to step 3 in the same process,
so the bitwise check costs one resumed process per config. It runs for one config per position strategy (its
sampler's state is what a resume must restore, and only the strategy decides it) and for the model options that
add trained parameters (learnable sinks, QK-norm's layer norms); the other model options change no state a
checkpoint holds. Every training process costs ~9 CPU-s, ~20 under torchrun (most of it start-up), which is why
not every config runs on two ranks and resumes (tests/unit_times.py names this module's share of the suite)."""

import shutil
from pathlib import Path

import pytest

from conftest import TINY_TRAIN, run_train, tensorboard_scalars

pytestmark = [pytest.mark.slow]  # torchrun layouts, one per distinct shipped config

CONFIG_DIR = Path(__file__).resolve().parents[2] / "pretrain" / "configs"
SHIPPED = sorted(CONFIG_DIR.glob("*.yaml"))
TINY_WINDOW = 32
STEPS = 3
# The only `--set` overrides applied to a shipped yaml, each with the reason a CPU test needs it.
SWAPS = {
    "model.transformer_impl=local": "Transformer Engine needs a GPU",
    **{item: "the size row of pretrain/table.py, shrunk to the tiny test size (tests/conftest.py TINY_TRAIN)"
       for item in TINY_TRAIN if not item.startswith("logging.")},
    f"model.seq_length={TINY_WINDOW}": "the window, shrunk to the tiny preset's",
    "schedule.train_tokens=null": "the token budget, replaced by the run length below",
    f"schedule.train_iters={STEPS}": "run length: two steps, a save, one more",
    "checkpoint.save_interval=2": "run length: a save after step 2",
    **{item: "run length: every step logged, the evaluation shrunk with the steps"
       for item in TINY_TRAIN if item.startswith("logging.")},
    "data.synthetic=true": "the shipped data.data_path is null (the user names their data)",
}
# Fields the swaps may change: those they name (and the run directory); preset_fields adds the tiny preset's.
SWAPPED_FIELDS = {item.split("=", 1)[0] for item in SWAPS} | {"checkpoint.save"}
# Shipped methods whose export is refused, with the words of the refusal (HF has no architecture computing them).
EXPORT_REFUSED = {"ssmax": "cannot export: SSMax", "sinks": "cannot export: attention sinks",
                  "rnope_swa": "cannot export: NoPE layers (model.no_rope_freq)"}


def window_swaps(path: Path) -> list[str]:
    """The shipped method's fields stated in windows (pretrain/table.py), at the tiny window."""
    from pretrain.table import METHODS

    method = METHODS[path.stem.split("_", 1)[1]]
    swaps = [f"model.{name}={rule(TINY_WINDOW)}" for name, rule in method.model_in_windows]
    if method.max_position_in_windows is not None:
        swaps.append(f"positions.max_position={method.position_fields(TINY_WINDOW)['max_position']}")
    return swaps


def shrunk_overrides(path: Path, run_dir) -> list[str]:
    """The `--set` list that turns the shipped yaml `path` into its CPU run in `run_dir`."""
    return [*SWAPS, *window_swaps(path), f"checkpoint.save={run_dir}"]


def flat(config) -> dict:
    """A TrainConfig as {'section.field': value} (the resolved config, defaults included)."""
    from pretrain.trainer.config import to_dict

    out = {}
    for key, value in to_dict(config).items():
        out.update({f"{key}.{k}": v for k, v in value.items()} if isinstance(value, dict) else {key: value})
    return out


def preset_fields(size: str) -> set[str]:
    """The model fields in which the tiny preset differs from a shipped size's (derived ones, kv_channels, too)."""
    import dataclasses

    from pretrain.table import model_preset

    shipped, tiny = dataclasses.asdict(model_preset(size)), dataclasses.asdict(model_preset("tiny"))
    return {f"model.{name}" for name in shipped if shipped[name] != tiny[name]}


def method_of(paths: list[Path]) -> str:
    """The shipped method a run's yamls share (their names are <size>_<method>)."""
    return paths[0].stem.split("_", 1)[1]


def distinct_runs() -> list[tuple[str, list[Path]]]:
    """(id, the yamls it covers) of each distinct shrunk config; the id names the method and the sizes."""
    from pretrain.table import SIZES
    from pretrain.trainer.config import load

    groups: dict[str, list[Path]] = {}
    for path in SHIPPED:
        shrunk = flat(load(path, shrunk_overrides(path, "RUN_DIR")))
        shrunk.pop("name")  # a label (the run's name in logs), not part of what runs
        groups.setdefault(repr(sorted(shrunk.items())), []).append(path)
    runs = []
    for paths in groups.values():
        methods = {path.stem.split("_", 1)[1] for path in paths}
        label = "+".join(sorted(methods)) if len(methods) > 1 else methods.pop()
        sizes = sorted((path.stem.split("_", 1)[0] for path in paths), key=list(SIZES).index)
        runs.append((f"{label}-{'-'.join(sizes)}", paths))
    return runs


RUNS = distinct_runs()
# Runs on 2 gloo ranks: the distributed optimizer's sharded path, as the 42m-1b launchers run it.
TWO_RANK_METHODS = {"posaug"}
# Model options that add trained parameters the checkpoint must hold (see the module docstring).
PARAMETER_METHODS = {"sinks", "qknorm"}


def resumed_runs() -> set[str]:
    """The run ids whose resume is checked: the first run of each position strategy, and PARAMETER_METHODS."""
    from pretrain.trainer.config import load

    first_of_strategy: dict[str, str] = {}
    for run_id, paths in sorted(RUNS, key=lambda run: method_of(run[1]) != "baseline"):
        first_of_strategy.setdefault(load(paths[0]).positions.strategy, run_id)
    return set(first_of_strategy.values()) | {run_id for run_id, paths in RUNS if method_of(paths) in PARAMETER_METHODS}


@pytest.mark.parametrize("path", SHIPPED, ids=[path.stem for path in SHIPPED])
def test_the_cpu_swaps_are_the_only_difference_from_each_shipped_yaml(path):
    from pretrain.trainer.config import load

    shipped, shrunk = load(path), load(path, shrunk_overrides(path, "RUN_DIR"))
    allowed = SWAPPED_FIELDS | preset_fields(shipped.preset) | {item.split("=")[0] for item in window_swaps(path)}
    shipped, shrunk = flat(shipped), flat(shrunk)
    changed = {key for key in shipped if shipped[key] != shrunk[key]}
    assert changed <= allowed, sorted(changed - allowed)
    assert shrunk["model.bf16"] is True and shrunk["parallel.use_distributed_optimizer"] is True
    assert shrunk["model.transformer_impl"] == "local" and shrunk["model.seq_length"] == TINY_WINDOW


def test_shrunk_configs_collapse_to_one_run_per_shipped_method():
    from pretrain.table import SHIPPED_METHODS

    assert sorted(path for _, paths in RUNS for path in paths) == SHIPPED
    methods = [{path.stem.split("_", 1)[1] for path in paths} for _, paths in RUNS]
    assert sorted(m for group in methods for m in group) == sorted(SHIPPED_METHODS), [r[0] for r in RUNS]


def test_the_resumed_runs_cover_every_position_strategy_and_the_parameter_adding_options():
    from pretrain.trainer.config import load

    resumed = {run_id: paths for run_id, paths in RUNS if run_id in RESUMED}
    strategies = {load(paths[0]).positions.strategy for _, paths in RUNS}
    assert {load(paths[0]).positions.strategy for paths in resumed.values()} == strategies
    assert PARAMETER_METHODS <= {method_of(paths) for paths in resumed.values()}
    assert TWO_RANK_METHODS <= {method_of(paths) for paths in resumed.values()}


def ranks(paths: list[Path]) -> int:
    """How many gloo ranks a run trains on (TWO_RANK_METHODS: 2)."""
    return 2 if method_of(paths) in TWO_RANK_METHODS else 1


RUN_IDS = [run_id for run_id, _ in RUNS]
RESUMED = sorted(resumed_runs(), key=RUN_IDS.index)  # one pass over the configs: each load reads a YAML


@pytest.fixture(scope="module")
def shipped_run(tmp_path_factory):
    """`shipped_run(run_id)`: the first yaml of that distinct shrunk config, three steps, saves after 2 and 3, trained
    once for the module: (the yamls covered, run dir, the CompletedProcess)."""
    trained: dict[str, tuple] = {}

    def train(run_id: str) -> tuple:
        if run_id not in trained:
            paths = dict(RUNS)[run_id]
            run_dir = tmp_path_factory.mktemp(paths[0].stem) / "run"
            proc = run_train([*shrunk_overrides(paths[0], run_dir), "--config", str(paths[0])], nproc=ranks(paths))
            trained[run_id] = paths, run_dir, proc
        return trained[run_id]
    return train


@pytest.mark.parametrize("run_id", RUN_IDS)
def test_shipped_config_trains_two_steps_and_saves_without_warnings(shipped_run, run_id):
    _, run_dir, proc = shipped_run(run_id)
    assert (run_dir / "iter_0000002" / "train_state.json").is_file()
    assert (run_dir / "latest_checkpointed_iteration.txt").read_text() == str(STEPS)
    losses = tensorboard_scalars(run_dir, "train/loss")
    assert sorted(losses) == [1, 2, 3] and all(loss == loss and loss < 100 for loss in losses.values()), losses
    assert "Warning" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]


@pytest.mark.parametrize("run_id", RESUMED)
def test_shipped_config_resumed_at_step_2_repeats_step_3_bit_for_bit(shipped_run, run_id, tmp_path):
    paths, run_dir, _ = shipped_run(run_id)
    shutil.copytree(run_dir / "iter_0000002", tmp_path / "iter_0000002")
    resumed = run_train([*shrunk_overrides(paths[0], tmp_path), "--config", str(paths[0])], nproc=ranks(paths))
    assert "resumed from iteration 2" in resumed.stdout, resumed.stdout[-2000:]
    for tag in ("train/loss", "train/grad_norm"):
        assert tensorboard_scalars(tmp_path, tag)[STEPS] == tensorboard_scalars(run_dir, tag)[STEPS], tag


@pytest.mark.parametrize("run_id", RUN_IDS)
def test_shipped_config_exports_to_hf_or_refuses_in_one_line(shipped_run, run_id, tmp_path, capsys):
    import torch
    from transformers import AutoModelForCausalLM

    from pretrain.hf.export import export_cli

    paths, run_dir, _ = shipped_run(run_id)
    output = tmp_path / "hf"
    code = export_cli([str(run_dir), "--output", str(output), "--no-tokenizer"])
    errors = capsys.readouterr().err.strip().splitlines()
    refusal = EXPORT_REFUSED.get(method_of(paths))
    if refusal is not None:
        assert code == 2 and len(errors) == 1 and refusal in errors[0], errors
        assert not output.exists() or not any(output.iterdir())
        return
    assert code == 0, errors
    model = AutoModelForCausalLM.from_pretrained(output)
    assert torch.isfinite(model(torch.arange(TINY_WINDOW)[None]).logits).all()
