# Part of slurm/common.sh's body, sourced by it after the settings are resolved and printed (not run on its own):
# the plan and the pre-flight check, then the dry run's end or, outside a job, the submit path (sbatch with the
# same launcher and arguments).

# _skip_or_die WHAT WHY: a check that could not run (or crashed) stops the launcher (exit 2) unless SKIP_PREFLIGHT=1
# (slurm/README.md): a check that cannot run must not pass for one that passed. A check that ran and refused is
# never skipped.
_skip_or_die() {
    if [ "${SKIP_PREFLIGHT:-0}" = 1 ]; then
        _log "WARNING: $1 could not run ($2); continuing without it because SKIP_PREFLIGHT=1"
    else
        _die "$1 could not run ($2); fix that (e.g. PYTHON=<a python with torch and this project>) or set SKIP_PREFLIGHT=1 to go on without it"
    fi
}

# ---- plan and pre-flight, in one Python process (pretrain/preflight.py; neither imports torch) ---------------
# plan: memory per GPU and wall clock before anything starts (pretrain/plan, slurm/README.md). Refuses (exit 2)
# when the predicted peak exceeds the GPU's memory; --no-plan-check / PLAN_CHECK=0 starts anyway. PLAN_GPU names
# the GPU model (python -m pretrain plan --help lists them). A plan or pre-flight that cannot run at all (no Python
# with torch on this host, e.g. a container-only setup) or crashes stops the launcher too, unless SKIP_PREFLIGHT=1.
# pre-flight: `train --check` loads the config as the trainer will, checks the layout for WORLD_SIZE ranks, the
# data prefix (manifest and shards present, enough tokens) and that the data's tokenizer fits model.vocab_size.
# The same check refuses the submit path, shows in the dry run, and ends a plain-sbatch job in its first
# seconds, before the model is built.
PLAN_CHECK=${PLAN_CHECK:-1}
PLAN_GPU=${PLAN_GPU:-h100-80gb}
PLAN_ARGS=()
if [ "$DEVICE" = gpu ]; then
    if [ "$IN_JOB" = 1 ]; then
        _TIME_LIMIT=$(scontrol show job "$JOB_ID" 2>/dev/null | sed -n 's/.*TimeLimit=\([^ ]*\).*/\1/p' | head -n1)
    fi
    _TIME_LIMIT=${_TIME_LIMIT:-$(_sbatch_default time)}
    _LEAD=$(_sbatch_default signal)
    _LEAD=${_LEAD##*@}
    PLAN_ARGS=(--plan "$CONFIG" --gpu "$PLAN_GPU" --nodes "$NNODES" --gpus-per-node "$TASKS_PER_NODE" --check
               --set "${SETS[@]}")
    case "$_TIME_LIMIT" in
        ''|UNLIMITED|Partition_Limit|NONE) ;;
        *) PLAN_ARGS+=(--slurm-time "$_TIME_LIMIT" --usr1-lead "${_LEAD:-0}") ;;
    esac
fi
_PREFLIGHT_SETS=("${SETS[@]}")
if [ "$IN_JOB" = 0 ] && [ "$DEVICE" = gpu ]; then
    # a login node has no GPU: the distributed optimizer's device check is the job's (it runs this again)
    _PREFLIGHT_SETS+=("parallel.use_distributed_optimizer=false")
fi
_CHECKS=$(mktemp -d "${TMPDIR:-/tmp}/posaug-preflight.XXXXXX")
set +e
(cd "$POSAUG_ROOT" && WORLD_SIZE=$WORLD_SIZE "$PYTHON" -m pretrain.preflight "$_CHECKS" "${PLAN_ARGS[@]}" \
    --train --config "$CONFIG" --set "${_PREFLIGHT_SETS[@]}")
_checks_rc=$?
set -e
_plan_rc=$(cat "$_CHECKS/plan.rc" 2>/dev/null || echo "$_checks_rc")
_preflight_rc=$(cat "$_CHECKS/preflight.rc" 2>/dev/null || echo "$_checks_rc")
_preflight=$(cat "$_CHECKS/preflight.out" 2>/dev/null || true)
_plan_crash=$(grep -v '^\s*$' "$_CHECKS/plan.crash" 2>/dev/null | tail -n1 || true)
rm -rf "$_CHECKS"

if [ "$DEVICE" = gpu ]; then
    if [ "$_plan_rc" = 2 ]; then
        if [ "$PLAN_CHECK" = 1 ]; then
            _die "the plan refuses this run (reason above): change the setting it names (e.g. OVERRIDES=schedule.micro_batch_size=1, TP/PP, more nodes, PLAN_GPU=<your GPU>), or pass --no-plan-check to start anyway"
        fi
        _log "WARNING: the plan says this run does not fit; starting anyway (--no-plan-check)"
    elif [ "$_plan_rc" != 0 ]; then
        _skip_or_die "the plan" "$PYTHON -m pretrain plan exited $_plan_rc${_plan_crash:+: $_plan_crash}"
    fi
else
    _log "plan: skipped (CPU run, no GPU memory to check)"
fi

_reason=$(printf '%s\n' "$_preflight" | { grep -v '^\s*$' || true; } | tail -n1)
if [ "$_preflight_rc" = 2 ]; then
    # exit 2 is the check's refusal (config, data, tokenizer, layout). A dry run (settings, plan and command
    # printed above) refuses as the submission would: one line, exit 2.
    _die "refused before $( [ "$DRY_RUN" = 1 ] && echo "submitting (dry run, nothing queued)" \
        || { [ "$SUBMIT" = 1 ] && echo "submitting (nothing queued)" || echo "building the model"; }): ${_reason}"
elif [ "$_preflight_rc" != 0 ]; then
    # the check could not run here or crashed (e.g. a login node whose python has no torch): fail closed, since a
    # submit would queue a job that may die at start; SKIP_PREFLIGHT=1 says to go on (the trainer validates the
    # same config when it starts)
    _skip_or_die "the pre-flight check" "$PYTHON -m pretrain train --check exited $_preflight_rc: ${_reason:-no output}"
else
    _log "pre-flight: ${_preflight##*$'\n'}"
fi

if [ "$DRY_RUN" = 1 ]; then
    exit 0
fi
if [ "$SUBMIT" = 1 ]; then
    command -v sbatch >/dev/null || _die "sbatch not found: run this on a SLURM login node (or add --dry-run)"
    # --time: the plan's predicted wall clock x TIME_MARGIN + TIME_PAD_MIN (start-up, evaluation, the saves),
    # at most the launcher's #SBATCH --time (a longer run continues in requeued jobs); SBATCH_TIMELIMIT wins.
    _TIME_ARGS=()
    if [ -z "${SBATCH_TIMELIMIT:-}" ] && [ "$DEVICE" = gpu ]; then
        _wall=$(cd "$POSAUG_ROOT" && "$PYTHON" -m pretrain plan "$CONFIG" --gpu "$PLAN_GPU" --nodes "$NNODES" \
                --gpus-per-node "$TASKS_PER_NODE" --json --set "${SETS[@]}" 2>/dev/null \
                | "$PYTHON" -c 'import json, sys; print(int(json.load(sys.stdin)["wall_seconds"]))' 2>/dev/null || true)
        if [ -n "$_wall" ]; then
            _minutes=$(( (_wall * ${TIME_MARGIN_PERCENT:-120} / 100 + 59) / 60 + ${TIME_PAD_MIN:-20} ))
            _cap=$(_sbatch_default time)
            _cap_minutes=$(cd "$POSAUG_ROOT" && "$PYTHON" -c "import sys; from pretrain.plan.report import parse_slurm_time as p; print(int(p(sys.argv[1]) // 60))" "$_cap" 2>/dev/null || echo "$_minutes")
            (( _minutes > _cap_minutes )) && _minutes=$_cap_minutes
            _TIME_ARGS=("--time=$_minutes")
            _log "--time=$_minutes min: the plan's ${_wall} s x ${TIME_MARGIN_PERCENT:-120}% + ${TIME_PAD_MIN:-20} min, at most the launcher's $_cap (SBATCH_TIMELIMIT=... to choose)"
        fi
    fi
    # The layout checked above is the one submitted: NNODES, TASKS_PER_NODE, GPUS_PER_NODE and CPUS_PER_TASK
    # from the environment become sbatch options where they differ from this launcher's #SBATCH lines.
    _LAYOUT_ARGS=()
    for _option in "nodes=$NNODES" "ntasks-per-node=$TASKS_PER_NODE" "gpus-per-node=$GPUS_PER_NODE" \
                   "cpus-per-task=$CPUS_PER_TASK"; do
        _line=$(_sbatch_default "${_option%%=*}")
        [ "${_line##*:}" = "${_option#*=}" ] || _LAYOUT_ARGS+=("--$_option")
    done
    _SUBMIT=(sbatch "${_TIME_ARGS[@]}" "${_LAYOUT_ARGS[@]}" "$LAUNCHER_FILE" "${LAUNCHER_ARGS[@]}")
    _log "checks passed: submitting ${_SUBMIT[*]}"
    exec "${_SUBMIT[@]}"
fi
