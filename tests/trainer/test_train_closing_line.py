"""`train` ends by saying where the last checkpoint is and which commands read it next."""

from conftest import TINY_TRAIN, run_train


def test_a_finished_training_names_its_last_checkpoint_and_the_next_commands(tmp_path, tiny_shards):
    run = tmp_path / "run"
    proc = run_train([*TINY_TRAIN, f"data.data_path={tiny_shards}", "schedule.train_iters=3",
                      f"checkpoint.save={run}"])
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith(f"done: the last checkpoint is {run / 'iter_0000003'}")
    assert f"python -m pretrain eval run {run} --data {tiny_shards}" in last
    assert f"python -m pretrain export-hf {run} --output hf/run" in last
    assert (run / "iter_0000003").is_dir()
