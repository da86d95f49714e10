"""The table of tests/protections.py: each protection, the exact source change that removes it, the tests that must
then fail. Entries follow their code: tests/test_protections.py fails the suite when a find string no longer
occurs exactly once."""

from __future__ import annotations

import dataclasses


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
      "exec'ed\n        time.sleep(0.0005)\n", "",
      ("tests/test_zygote.py::test_a_forked_process_starts_as_the_tests_child_however_long_its_helper_takes_to_exit",)),
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
    P("data-prep-second-ctrl-c", "`data_prep build`: Ctrl-Cs after the first ignored while it unwinds",
      "the handler's SIG_IGN removed", "data_prep/cli.py",
      "    signal.signal(signal.SIGINT, signal.SIG_IGN)\n    raise KeyboardInterrupt", "    raise KeyboardInterrupt",
      ("tests/data_prep/test_data_prep_interrupt.py::test_after_the_first_ctrl_c_the_ones_that_follow_are_ignored_"
       "while_the_build_unwinds",)),
    P("layer-frequency-call", "a layer frequency above the layer count refused at `--check`", "the refusal call "
      "removed", "pretrain/trainer/config.py", "        check_no_ops(self.model)", "        pass", (LAYER_FREQUENCY,)),
    P("layer-frequency-threshold", "a layer frequency above the layer count refused at `--check`",
      "the threshold off by one (no_rope_freq = layers + 1 accepted)", "pretrain/trainer/config_no_ops.py",
      "model.no_rope_freq > layers:", "model.no_rope_freq > layers + 1:", (LAYER_FREQUENCY,)),
    P("layer-frequency-boundary", "a layer frequency equal to the layer count accepted at `--check`",
      "the threshold off by one the other way (no_rope_freq = layers refused)", "pretrain/trainer/config_no_ops.py",
      "model.no_rope_freq > layers:", "model.no_rope_freq >= layers:",
      ("tests/trainer/test_config_no_ops.py::test_a_layer_frequency_equal_to_the_layer_count_is_accepted_at_check",)),
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
      "    for pid, began in found.items():\n        if _stat_field(pid, 4) not in found and began is not None:",
      "    for pid, began in reversed(found.items()):\n        if began is not None:",
      (HANG_DIAGNOSIS + "test_the_rank_found_is_the_process_whose_children_inherited_its_launch_environment",)),
    P("hang-find-rank-used", "hang report: a rank stopped before its first heartbeat is killed by the reporter",
      "`find_rank` not called by the watchdog", "pretrain/trainer/watchdog.py",
      "                record = find_rank(rank)", "                pass",
      ("tests/trainer/test_hang_before_heartbeat.py",)),
)
