"""Protections broken on purpose: each entry of TABLE removes one protection in a scratch copy of the working tree
and runs the tests that must then fail.

    .venv/bin/python tests/protections.py --list          # the table as markdown
    .venv/bin/python tests/protections.py [NAME ...]      # break each entry (or the named ones) and run its tests
    .venv/bin/python tests/protections.py --baseline ...  # first run the same tests without the break

Outcomes: CAUGHT (the tests failed with the break in place), MISSED (they passed: the protection is not tested),
STALE (the entry's find string does not occur exactly once: the code moved, and the entry must follow it), ERROR
(no verdict: pytest could not run the tests, they timed out, or with --baseline they fail without the break).
Exit 0 only if every entry run was CAUGHT; 2 for an unknown name. tests/test_protections.py checks the table
against the tree on every suite run; this script is not collected (no test_ prefix).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[1]
# The venv's .pth that loads tests/megatron_record.py into every interpreter a recording test starts (the recorder
# names its own path there). It is aimed at the scratch copy's recorder for an entry's run (else the main tree's,
# unbroken, would record for a broken copy's tests: a break of the recorder MISSED), and put back afterwards.
SITE_HOOK = "zz_posaug_megatron_record.pth"
TIMEOUT_S = 1200  # one entry's pytest run; setup.cfg's per-test timeout is 900 s


@dataclasses.dataclass(frozen=True)
class Protection:
    """One protection, the break that removes it (an exact string replacement in one file), the tests that fail."""

    name: str
    protection: str
    how: str
    file: str
    find: str
    replace: str
    tests: tuple[str, ...]
    keyword: str = ""  # a pytest -k expression narrowing `tests`
    env: tuple[tuple[str, str], ...] = ()  # set for the pytest run: where the protection only acts under it
    sigint_ignored: bool = False  # pytest started as a shell starts a background job (`make test &`)


P = Protection
ZYGOTE_FRESH = "tests/test_zygote.py::test_cwd_environment_argv_signals_session_and_stdin_are_a_fresh_processes"
RECORD = "tests/test_megatron_record.py::"
CONFIG_BOUNDS = "tests/trainer/test_config_bounds.py::"
STOP = "tests/trainer/test_stop_signals.py::"
RYARN = "tests/positions/test_randomized_yarn.py::"
RYARN_CURRICULUM = RYARN + "test_the_default_curriculum_is_the_papers_8k_10k_12k_16k_16k_in_equal_shares_of_the_run"
RYARN_AT_WINDOW = RYARN + "test_with_the_range_at_the_window_training_is_our_yarn_exactly"
RYARN_EVERY_STEP = RYARN + ("test_every_training_step_uses_our_yarn_at_s_equal_to_the_range_over_the_window_or_the_"
                            "set_factor")
RYARN_BAD = RYARN + "test_bad_ryarn_settings_are_refused_in_one_line_naming_the_field"
RYARN_INFERENCE = RYARN + "test_an_inference_scaling_other_than_a_larger_yarn_is_refused_naming_the_flags"
HF_RYARN = ("tests/hf/test_hf_rope_config.py::test_a_ryarn_run_exports_the_yarn_it_evaluates_with_and_refuses_any_"
            "other_scaling")
HANG_DIAGNOSIS = "tests/trainer/test_hang_diagnosis.py::"
EVAL_KERNEL = "tests/evaluation/test_eval_kernel_choice.py::"
LAYER_FREQUENCY = ("tests/trainer/test_config_no_ops.py::test_a_layer_frequency_above_the_layer_count_is_refused_at_"
                   "check_in_one_line")

TABLE: tuple[Protection, ...] = (
    P("zygote-signals", "zygote: a forked process gets a fresh interpreter's signal dispositions",
      "the reset loop removed, a SIGTERM disposition left in its place (as a server's handler would be)",
      "tests/zygote.py", "    for number in range(1, signal.NSIG):  # a fresh interpreter's dispositions\n",
      "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n    for number in ():\n", (ZYGOTE_FRESH,)),
    P("zygote-stderr-buffering", "zygote: stderr buffered as a fresh interpreter's (not line-buffered under "
      "PYTHONUNBUFFERED)", "line buffering whatever PYTHONUNBUFFERED says (run with PYTHONUNBUFFERED=1)",
      "tests/zygote.py", 'line_buffering=not unbuffered and (fd == 2 or os.isatty(fd)) and mode == "w",',
      'line_buffering=(fd == 2 or os.isatty(fd)) and mode == "w",', (ZYGOTE_FRESH,),
      env=(("PYTHONUNBUFFERED", "1"),)),
    P("zygote-parent", "zygote: the forked process starts once it is the test's child (getppid() the test's)",
      "the wait for the re-parenting removed", "tests/zygote.py",
      '    while os.getppid() == request["helper"]:  # start once re-parented: getppid() is the test\'s, as when '
      "exec'ed\n        time.sleep(0.0005)\n", "", (ZYGOTE_FRESH,)),
    P("zygote-environ-of", "zygote: a forked process's environment readable by pid (`environ_of`)",
      "`_publish_environ` not called", "tests/zygote.py", '    _publish_environ(request["environ_dir"])\n', "",
      ("tests/test_zygote.py::test_environ_of_gives_the_processs_own_environment_where_proc_shows_the_servers"
       "[forked]",)),
    P("zygote-server-limit", "zygote: a new import-time environment past the limit replaces the least recently used "
      "server", "`server_for` returning None at the limit, as before", "tests/zygote.py",
      "            while len(_servers) >= MAX_SERVERS:  # its forked processes are the tests' children: they live on\n"
      "                _servers.popitem(last=False)[1].close()\n",
      "            if len(_servers) >= MAX_SERVERS:\n                return None\n",
      ("tests/test_zygote.py::test_a_new_environment_past_the_limit_replaces_the_least_recently_used_server",)),
    P("record-unwatchable-exec", "Megatron-use record: an exec'ed interpreter counts unless it records for its test",
      "`exec_counts` returning True for any exec of the interpreter", "tests/megatron_record.py",
      "    if words[0] != sys.executable:\n        return True\n", "    return True\n",
      (RECORD + "test_an_interpreter_that_cannot_be_watched_counts_when_it_is_exec_ed",)),
    P("sigint-background", "SIGINT as under a terminal when `make test` runs as a background job (a shell ignores "
      "SIGINT there, and exec passes it on)", "the reset in signal_guard's pytest_configure removed, the suite "
      "started with SIGINT ignored", "tests/signal_guard.py",
      "    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:\n"
      "        signal.signal(signal.SIGINT, signal.default_int_handler)\n", "",
      (ZYGOTE_FRESH, "tests/data_prep/test_data_prep_interrupt.py"), sigint_ignored=True),
    P("signal-guard-restore", "a signal disposition a test leaves changed is restored and the test named "
      "(tests/signal_guard.py)", "the restore removed", "tests/signal_guard.py",
      "                signal.signal(number, handler)\n", "", ("tests/test_signal_guard.py",)),
    P("record-bare-megatron", "Megatron-use record: an exec'ed Python's import of the bare `megatron` counts",
      '`megatron_name` without `name == "megatron"`', "tests/megatron_record.py",
      'return name == "megatron" or name.startswith("megatron.")', 'return name.startswith("megatron.")',
      (RECORD + "test_a_python_started_by_bash_is_recorded_by_the_imports_it_executes",
       RECORD + "test_a_python_exec_ed_from_a_test_is_recorded_by_the_imports_it_executes",
       RECORD + "test_a_python_started_without_the_recording_environment_that_imports_megatron_is_unattributed")),
    P("record-executed-imports", "Megatron-use record: executed imports counted", "the `import` wrapper not installed",
      "tests/megatron_record.py", "    builtins.__import__ = recording_import\n", "",
      (RECORD + "test_a_module_importing_megatron_directly_or_through_our_module_is_recorded_whole",)),
    P("record-session-fixture", "Megatron-use record: a session-scoped fixture's setup is its own unit",
      "the SharedFixtureUnits plugin not registered", "tests/conftest.py",
      '    if not config.pluginmanager.has_plugin("posaug-shared-fixture-units"):', "    if False:",
      (RECORD + "test_a_session_scoped_fixtures_setup_is_recorded_as_its_own_unit_in_the_suite",)),
    P("config-aliases", "config bounds: aliases counted expanded", "the MAX_VALUES check removed",
      "pretrain/trainer/config_values.py", "        if count > MAX_VALUES:", "        if False:",
      (CONFIG_BOUNDS + "test_a_set_mapping_with_multiplying_aliases_is_refused",
       CONFIG_BOUNDS + "test_an_alias_bomb_is_refused_in_seconds_under_a_memory_cap")),
    P("eval-kernel-choice", "a triton-trained run read on CPU with the unfused kernel",
      "`runnable_here` returning the recorded config", "pretrain/trainer/inference_model.py",
      '        return dataclasses.replace(model_config, rope_kernel="auto")', "        return model_config",
      (EVAL_KERNEL + "test_a_triton_trained_run_is_evaluated_on_cpu_with_a_one_line_note_and_the_same_numbers",)),
    P("run-dir-name-length", "run directory names over 255 bytes refused in one line", "the length check disabled",
      "pretrain/trainer/config.py", "        if size > NAME_MAX:", "        if False:",
      (CONFIG_BOUNDS + "test_a_run_directory_name_longer_than_a_filesystem_allows_is_one_line",)),
    P("stop-commit-guard", "a second Ctrl-C after the stop save committed: exit 75, no traceback",
      "the commit guard (`StopSignal.committing`) not passed to the stop save", "pretrain/trainer/loop.py",
      "                save(done, commit_guard=stop.committing)", "                save(done)",
      (STOP + "test_a_second_ctrl_c_after_the_stop_save_completed_exits_75_from_it_without_a_traceback",)),
    P("stop-partial", "a second Ctrl-C before the commit: the partial removed, exit 130", "the partial's removal "
      "dropped", "pretrain/trainer/loop.py", "        removed = checkpoint.remove_partials(config.run_dir) if "
      'os.environ.get("RANK", "0") == "0" else []', "        removed = []",
      (STOP + "test_a_second_ctrl_c_before_the_stop_save_completed_removes_its_partial_and_exits_130",)),
    P("data-prep-ctrl-c", "`data_prep build` Ctrl-C: one line, exit 130", "the KeyboardInterrupt handler removed",
      "data_prep/cli.py", "    except KeyboardInterrupt:\n        # inputs are only ever read",
      "    except ArithmeticError:\n        # inputs are only ever read",
      ("tests/data_prep/test_data_prep_interrupt.py",)),
    P("layer-frequency-call", "a layer frequency above the layer count refused at `--check`", "the refusal call "
      "removed", "pretrain/trainer/config.py", "        check_no_ops(self.model)", "        pass", (LAYER_FREQUENCY,)),
    P("layer-frequency-threshold", "a layer frequency above the layer count refused at `--check`",
      "the threshold off by one (no_rope_freq = layers + 1 accepted)", "pretrain/trainer/config_no_ops.py",
      "model.no_rope_freq > layers:", "model.no_rope_freq > layers + 1:", (LAYER_FREQUENCY,)),
    P("runs-damaged", "`runs` names a damaged last checkpoint", "the size check turned off",
      "pretrain/trainer/run_dir.py", '            if size != expected["bytes"]:', "            if False:",
      ("tests/experiments/test_faults_status.py::test_a_damaged_last_checkpoint_is_called_damaged_naming_the_file_"
       "not_missing",)),
    P("eval-set-fields", "`eval --set` takes inference-time fields only", "the allow-check accepting every key",
      "pretrain/trainer/inference_model.py", "        if key in INFERENCE_FIELDS:", "        if True:",
      (EVAL_KERNEL + "test_eval_set_of_a_field_that_changes_the_weights_meaning_is_refused_in_one_line",)),
    P("micro-batch-available", "`micro_batch_size: auto` sized against available memory", "the host's total used "
      "instead", "pretrain/trainer/micro_batch.py", "    free = host_available_bytes()", "    free = total",
      ("tests/trainer/test_micro_batch_auto.py::test_auto_on_cpu_sizes_against_the_memory_available_now_not_the_"
       "hosts_total",)),
    P("ryarn-range", "Randomized YaRN: the range L_t of the paper's curriculum stages", "L_t always max_position",
      "megatron_ext/positions/randomized_yarn.py",
      "    return train_seq_len + math.floor(fraction * (max_position - train_seq_len) + 0.5)",
      "    return max_position", (RYARN_CURRICULUM, RYARN_AT_WINDOW)),
    P("ryarn-stage-shares", "Randomized YaRN: the curriculum's stages in equal shares of the run", "the stages' share "
      "off by 7 steps", "megatron_ext/positions/randomized_yarn.py", "step * num_stages // max(1, total_steps)",
      "(step + 7) * num_stages // max(1, total_steps)", (RYARN_CURRICULUM,)),
    P("ryarn-sorted", "Randomized YaRN: sorted distinct positions", "the sort dropped (rpe_positions)",
      "megatron_ext/positions/strategies.py", "    return chosen.sort(dim=-1).values.to(torch.float32)",
      "    return chosen.to(torch.float32)",
      (RYARN + "test_training_positions_are_sorted_distinct_integers_below_the_steps_range",)),
    P("ryarn-uniform", "Randomized YaRN: a uniform subset of [0, L_t), per sample", "positions a stretched arange",
      "megatron_ext/positions/sampler.py",
      "            keys = self._uniforms(step, samples, self._ryarn_range(step, seq_len), STREAM_POSITIONS, device)\n"
      "            return self._ryarn(strategies.rpe_positions(keys, seq_len, lengths), device)",
      "            return self._ryarn(strategies.scaled_positions(seq_len, self._ryarn_range(step, seq_len) / seq_len, "
      "device), device)",
      (RYARN + "test_every_position_of_the_range_is_drawn_equally_often_as_a_uniform_subset_is",
       RYARN + "test_per_sample_rows_are_each_a_sorted_subset_and_differ_between_sequences")),
    P("ryarn-documents", "Randomized YaRN: each document its own sorted subset", "documents drawn as one window",
      "megatron_ext/positions/sampler.py",
      "            return self._ryarn(per_document.rpe_document_positions(keys, documents), device)",
      "            return self._ryarn(strategies.rpe_positions(keys, seq_len), device)",
      (RYARN + "test_documents_each_get_a_sorted_subset_restarting_below_the_range",)),
    P("ryarn-attention-factor", "Randomized YaRN: our YaRN numerics (scaling.py) in training",
      "the attention factor set to 1", "megatron_ext/positions/sampler.py",
      "attention_factor=self._ryarn_attention)", "attention_factor=1.0)", (RYARN_AT_WINDOW, RYARN_EVERY_STEP)),
    P("ryarn-scale", "Randomized YaRN: s = L / w", "s halved", "megatron_ext/positions/config.py",
      "else self.max_position / train_seq_len\n", "else self.max_position / train_seq_len / 2\n",
      (RYARN_EVERY_STEP, RYARN_AT_WINDOW)),
    P("ryarn-eval-factor", "Randomized YaRN: evaluation at the set rope_scaling_factor",
      "evaluation ignoring rope_scaling_factor", "megatron_ext/positions/sampler.py",
      "            factor = randomized_yarn.inference_factor(cfg.ryarn_scale(self.train_seq_len), cfg.rope_scaling,\n"
      "                                                      cfg.rope_scaling_factor)",
      "            factor = cfg.ryarn_scale(self.train_seq_len)",
      (RYARN + "test_evaluation_is_plain_positions_under_the_baselines_yarn_at_inference",)),
    P("ryarn-refuse-decreasing", "Randomized YaRN: decreasing stages refused", "the check removed",
      "megatron_ext/positions/config.py",
      "        if any(b < a for a, b in zip(self.ryarn_stages, self.ryarn_stages[1:])):", "        if False:",
      (RYARN_BAD,)),
    P("ryarn-refuse-small-factor", "Randomized YaRN: an inference factor below s refused", "the check removed",
      "megatron_ext/positions/randomized_yarn.py", "    if inference is None or not inference >= factor:",
      "    if inference is None:",
      (RYARN + "test_settings_that_contradict_the_window_are_refused_when_the_sampler_is_built", RYARN_INFERENCE)),
    P("ryarn-refuse-scaling-config", "Randomized YaRN: another scaling than YaRN refused in the config",
      "the check removed", "megatron_ext/positions/config.py",
      '        if self.strategy == "ryarn" and self.rope_scaling not in INFERENCE_KINDS:', "        if False:",
      (RYARN_BAD,)),
    P("ryarn-refuse-scaling-eval", "Randomized YaRN: another scaling than YaRN refused at evaluation",
      "the check removed", "megatron_ext/positions/randomized_yarn.py", "    if kind not in INFERENCE_KINDS:",
      "    if False:", (RYARN_INFERENCE,)),
    P("hf-ryarn-export", "Randomized YaRN: a ryarn run exports the YaRN it evaluates with", "the export branch "
      "removed", "pretrain/hf/rope.py", '    if positions.strategy == "ryarn":\n        if eval_length is not None:',
      "    if False:\n        if eval_length is not None:", (HF_RYARN,)),
    P("hf-ryarn-factor", "Randomized YaRN: an export's --factor without --rope-scaling yarn refused",
      "--factor without yarn accepted", "pretrain/hf/rope.py",
      '            if factor is not None:\n                raise ValueError("--factor needs --rope-scaling yarn (',
      '            if False:\n                raise ValueError("--factor needs --rope-scaling yarn (', (HF_RYARN,)),
    P("drope-zeros", "DroPE: no rotation after the switch (every position 0)", "the positions after the switch an "
      "arange instead of zeros", "megatron_ext/positions/sampler.py",
      "        return RopePositions(torch.zeros(seq_len, dtype=torch.float32, device=device))",
      "        return RopePositions(torch.arange(seq_len, dtype=torch.float32, device=device))",
      ("tests/positions/test_drope.py",)),
    P("drope-lr-resume", "DroPE: the recalibration's learning-rate schedule restored on resume", "the schedule's "
      "restore on resume removed", "pretrain/trainer/recalibration.py",
      '        self.recalibration.load_state_dict(state["recalibration"])\n', "",
      ("tests/trainer/test_drope_training.py::test_a_resumed_run_follows_the_uninterrupted_one_bitwise"
       "[mid-recalibration]",)),
    P("hang-report-heartbeat", "hang report: a rank writing or awaiting it keeps publishing its heartbeat (a peer's "
      "second look sees it live)", "the wait loop's `_pause` made a plain sleep", "pretrain/trainer/watchdog.py",
      "            time.sleep(min(self.tick, left))\n            self.beats.publish()\n",
      "            time.sleep(min(self.tick, left))\n",
      ("tests/trainer/test_hangs.py::test_a_rank_awaiting_another_ranks_hang_report_keeps_its_heartbeat_moving",)),
    P("hang-find-rank-job", "hang report: a rank stopped before its first heartbeat is found by its launch "
      "environment, its own job's", "the MASTER_ADDR/MASTER_PORT comparison removed", "pretrain/trainer/hang_exit.py",
      " and all(env.get(key) == job[key] for key in LAUNCH_KEYS):", ":",
      (HANG_DIAGNOSIS + "test_the_same_rank_of_another_job_on_the_host_is_not_found",)),
    P("hang-find-rank-parent", "hang report: the rank found is the process whose children inherited its launch "
      "environment", "the parent check removed, the match order reversed", "pretrain/trainer/hang_exit.py",
      "    for pid, began in found.items():\n        if _parent(pid) not in found and began is not None:",
      "    for pid, began in reversed(found.items()):\n        if began is not None:",
      (HANG_DIAGNOSIS + "test_the_rank_found_is_the_process_whose_children_inherited_its_launch_environment",)),
    P("hang-find-rank-used", "hang report: a rank stopped before its first heartbeat is killed by the reporter",
      "`find_rank` not called by the watchdog", "pretrain/trainer/watchdog.py",
      "                record = find_rank(rank)", "                pass",
      ("tests/trainer/test_hang_before_heartbeat.py",)),
)


def markdown() -> str:
    """The table as markdown: protection | broken how | tests that must fail."""
    rows = ["| protection | broken how | tests that must fail |", "|---|---|---|"]
    for entry in TABLE:
        tests = ", ".join(entry.tests) + (f" (-k {entry.keyword})" if entry.keyword else "")
        cells = (entry.protection, f"{entry.how} (`{entry.file}`; entry {entry.name})", tests)
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows) + "\n"


def stale_reason(entry: Protection, root: Path = REPO) -> str | None:
    """Why the break cannot be applied under `root` (one line), or None when its find string occurs exactly once."""
    path = root / entry.file
    if not path.is_file():
        return f"{entry.file} does not exist"
    count = path.read_text().count(entry.find)
    if count != 1:
        first = entry.find.strip().splitlines()[0]
        return f"the find string occurs {count} times in {entry.file}, not once: {first!r}"
    return None


def scratch_copy(destination: Path) -> None:
    """Copy the working tree's tracked and untracked-not-ignored files (not .venv) into `destination`."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if not source.is_symlink() and not source.is_file():  # tracked but deleted in the working tree
            continue
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)


def tests_python() -> str:
    """The interpreter the tests run with: the repository's .venv, else this one."""
    venv = REPO / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def _end(proc: subprocess.Popen) -> None:
    """End a pytest run's process group: SIGINT first so pytest tears its tests down, then harder."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=15)
            break
        except subprocess.TimeoutExpired:
            continue


def run_tests(entry: Protection, root: Path, python: str, timeout: float) -> tuple[int | None, str]:
    """(pytest's exit status or None on timeout, its output) for the entry's tests run in the tree at `root`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POSAUG_MEGATRON", "POSAUG_TEST_UNIT",
                                                                     "PYTEST_"))}
    env.update(dict(entry.env), PYTHONPATH=str(root))  # the scratch copy's packages, in every process a test starts
    command = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *entry.tests]
    if entry.keyword:
        command += ["-k", entry.keyword]
    disposition = signal.SIG_IGN if entry.sigint_ignored else signal.SIG_DFL
    proc = subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, disposition))
    try:
        output = proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        _end(proc)
        return None, proc.communicate()[0]
    except BaseException:
        _end(proc)
        raise
    return proc.returncode, output


def _resolves_into(root: Path, python: str) -> str | None:
    """Where the scratch copy's pytest would import the packages from, when that is not the copy (else None)."""
    probe = ("import importlib.util as u; "
             "print(*(u.find_spec(m).origin for m in ('pretrain', 'megatron_ext', 'data_prep')))")
    origins = subprocess.run([python, "-c", probe], cwd=root, env=dict(os.environ, PYTHONPATH=str(root)),
                             capture_output=True, text=True).stdout.split()
    outside = [o for o in origins if not Path(o).resolve().is_relative_to(root.resolve())]
    return None if len(origins) == 3 and not outside else f"imports resolve outside the copy: {outside or origins}"


def _summary(output: str) -> str:
    """pytest's verdict lines: the first failure and the closing count."""
    lines = [line for line in output.splitlines() if line.strip()]
    failed = [line for line in lines if line.startswith(("FAILED ", "ERROR "))][:1]
    closing = [line.strip("= ") for line in lines if re.search(r"\b(passed|failed|error|skipped|deselected|no tests "
                                                                 r"ran)\b.* in [\d.]+s", line)][-1:]
    return "; ".join(part[:200] for part in failed + closing) or (lines[-1][:200] if lines else "no output")


def run_entry(entry: Protection, python: str, baseline: bool, timeout: float,
              hook: Path | None = None) -> tuple[str, str, str]:
    """(CAUGHT | MISSED | STALE | ERROR, one line saying why, pytest's output) for one entry, in a scratch copy."""
    reason = stale_reason(entry)
    if reason:
        return "STALE", reason, ""
    root = Path(tempfile.mkdtemp(prefix=f"protections_{entry.name}_")) / REPO.name
    try:
        scratch_copy(root)
        if (wrong := _resolves_into(root, python)) is not None:
            return "ERROR", wrong, ""
        with _site_hook_naming(hook, root):
            if baseline:
                code, output = run_tests(entry, root, python, timeout)
                if code != 0:
                    return "ERROR", f"without the break: pytest exit {code}: {_summary(output)}", output
            path = root / entry.file
            path.write_text(path.read_text().replace(entry.find, entry.replace, 1))
            code, output = run_tests(entry, root, python, timeout)
        status = {None: "ERROR", 0: "MISSED", 1: "CAUGHT"}.get(code, "ERROR")
        why = {None: f"timed out after {timeout:.0f} s: ", 0: "", 1: ""}.get(code, f"pytest exit {code}, no verdict: ")
        return status, why + _summary(output), output
    finally:
        _kill_leftovers(root)
        shutil.rmtree(root.parent, ignore_errors=True)


def _kill_leftovers(root: Path) -> None:
    """SIGKILL what the run left behind: a test's own session or a stopped rank escapes the group's signal (an
    interrupted hang test left its SIGSTOPped rank). Ours are the processes whose PYTHONPATH is the copy."""
    mark = b"\0PYTHONPATH=" + os.fsencode(root) + b"\0"
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and mark in b"\0" + Path(f"/proc/{entry}/environ").read_bytes():
                os.kill(int(entry), signal.SIGKILL)
        except OSError:  # gone meanwhile, or another user's
            continue


def _site_hook(python: str) -> Path:
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    return Path(purelib) / SITE_HOOK


@contextlib.contextmanager
def _site_hook_naming(hook: Path | None, root: Path) -> Iterator[None]:
    """Inside the block the site hook (SITE_HOOK) loads `root`'s recorder; after it, it is as it was before."""
    before = hook.read_bytes() if hook is not None and hook.exists() else None
    recorder = Path("tests", "megatron_record.py")  # only its path: the hook also names the venv's own directory
    if before is not None:
        _write_atomically(hook, before.replace(os.fsencode(REPO / recorder), os.fsencode(root / recorder)))
    try:
        yield
    finally:
        if hook is not None and (hook.read_bytes() if hook.exists() else None) != before:
            hook.unlink(missing_ok=True) if before is None else _write_atomically(hook, before)


def _write_atomically(path: Path, content: bytes) -> None:
    part = path.with_name(f".{path.name}.protections.{os.getpid()}")
    part.write_bytes(content)
    os.replace(part, path)  # interpreters may be starting


def _header(argv: list[str]) -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                             text=True).stdout.splitlines()
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    now = datetime.datetime.now(datetime.timezone.utc)
    return (f"# command: {' '.join(argv)}\n# commit: {head.stdout.strip()} ({len(changed)} tracked files changed in "
            f"the working tree)\n# date: {now:%Y-%m-%d %H:%M:%S} UTC\n# uptime: {uptime}\n")


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="entries to run (default: all)")
    parser.add_argument("--list", action="store_true", help="print the table as markdown and exit")
    parser.add_argument("--baseline", action="store_true", help="first run each entry's tests without the break")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds for one pytest run")
    parser.add_argument("--verbose", "-v", action="store_true", help="print the end of each pytest run's output")
    args = parser.parse_args(argv)
    entries = {entry.name: entry for entry in TABLE}
    unknown = [name for name in args.names if name not in entries]
    if unknown:
        print(f"error: unknown entries {', '.join(unknown)}; `--list` names them", file=sys.stderr)
        return 2
    if args.list:
        print(markdown(), end="")
        return 0
    chosen = [entries[name] for name in args.names] if args.names else list(TABLE)
    # Ctrl-C and a kill end through the same clean-up, even where a shell started this as a background job (SIGINT
    # ignored): the scratch copy and the pytest run's processes go with it.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.default_int_handler)
    python = tests_python()
    hook = _site_hook(python)
    print(_header([python, *(sys.argv if argv is None else [__file__, *argv])]), flush=True)
    counts: dict[str, int] = {}
    started = time.monotonic()
    try:
        for entry in chosen:
            began = time.monotonic()
            status, why, output = run_entry(entry, python, args.baseline, args.timeout, hook)
            counts[status] = counts.get(status, 0) + 1
            print(f"{status:<7} {entry.name:<28} {time.monotonic() - began:6.1f} s  {why}", flush=True)
            if args.verbose and output:
                print("".join(f"    {line}\n" for line in output.splitlines()[-40:]), end="", flush=True)
    except KeyboardInterrupt:
        print("interrupted: the scratch copy was removed", file=sys.stderr)
        return 130
    total = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    print(f"{len(chosen)} entries: {total} in {time.monotonic() - started:.1f} s")
    return 0 if counts.get("CAUGHT", 0) == len(chosen) else 1


if __name__ == "__main__":
    sys.exit(main())
