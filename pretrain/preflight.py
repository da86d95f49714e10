"""The launchers' two checks in one interpreter: `plan --check` (memory fit) and `train --check` (config, data,
tokenizer, layout for WORLD_SIZE ranks).

slurm/common_checks.sh runs both through this module so a dry run or a submission starts one Python, and neither
check imports torch or Megatron-Core (tests/trainer/test_checks_without_torch.py), but for the plan's first build of a
config's parameter shapes, which it caches. The launcher keeps deciding what each outcome means (a plan that
does not fit can be overridden with --no-plan-check, a pre-flight refusal cannot), so this module only runs the
two commands and records what they said:

    python -m pretrain.preflight RESULTS_DIR [--plan PLAN_ARGS ...] --train TRAIN_ARGS ...

The plan prints to the terminal exactly as `python -m pretrain plan` does; its exit code goes to RESULTS_DIR/plan.rc
(absent without --plan). The pre-flight's output goes to RESULTS_DIR/preflight.out and its exit code to
RESULTS_DIR/preflight.rc; a plan that crashes leaves its traceback in RESULTS_DIR/plan.crash (the pre-flight's is in
its .out). A check that crashes (exit 1) or cannot run at all (no torch on a login node: its .rc file absent) stops
the launcher with exit 2 unless SKIP_PREFLIGHT=1 (slurm/README.md).
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path


def _exit_code(argv: list[str], crash: Path | None = None) -> int:
    """`python -m pretrain ARGV`'s exit code, whether returned or raised (argparse's SystemExit); a crash is exit
    code 1, as the command alone would have ended, with its traceback written to `crash` (else printed), whose
    last line the launcher quotes when it stops; the other check still runs."""
    from pretrain.__main__ import main as pretrain

    try:
        return int(pretrain(argv) or 0)
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else 2
    except Exception:  # noqa: BLE001  the launcher stops on it (exit 2) unless SKIP_PREFLIGHT=1
        if crash is None:
            traceback.print_exc()
        else:
            crash.write_text(traceback.format_exc())
        return 1


def _to_file(path: Path, argv: list[str]) -> int:
    """Run the command with file descriptors 1 and 2 (and sys.stdout/stderr) writing to `path`."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "w") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        try:
            return _exit_code(argv)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def split(argv: list[str]) -> tuple[Path, list[str] | None, list[str]]:
    """RESULTS_DIR, the plan's arguments (None without --plan) and the pre-flight's, from the command line."""
    if len(argv) < 2 or "--train" not in argv:
        raise ValueError("usage: python -m pretrain.preflight RESULTS_DIR [--plan ARGS ...] --train ARGS ...")
    results, rest = Path(argv[0]), argv[1:]
    cut = rest.index("--train")
    before, train_args = rest[:cut], rest[cut + 1:]
    if before and before[0] != "--plan":
        raise ValueError(f"unexpected {before[0]!r} before --train: expected --plan ARGS ...")
    return results, (before[1:] if before else None), train_args


def main(argv: list[str]) -> int:
    """Run the plan (when asked) and the pre-flight; 0 once both outcomes are recorded."""
    results, plan_args, train_args = split(argv)
    if plan_args is not None:
        code = _exit_code(["plan", *plan_args], crash=results / "plan.crash")
        (results / "plan.rc").write_text(f"{code}\n")
    # A login node has no GPU: the job checks its own device (pretrain.trainer.cli.DEVICE_CHECK_IN_JOB).
    before = os.environ.get("POSAUG_DEVICE_CHECK_IN_JOB")
    os.environ["POSAUG_DEVICE_CHECK_IN_JOB"] = "1"
    try:
        code = _to_file(results / "preflight.out", ["train", "--check", *train_args])
    finally:
        if before is None:
            del os.environ["POSAUG_DEVICE_CHECK_IN_JOB"]
        else:
            os.environ["POSAUG_DEVICE_CHECK_IN_JOB"] = before
    (results / "preflight.rc").write_text(f"{code}\n")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
