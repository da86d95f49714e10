"""The command line of `python -m pretrain reproduce --suite tasks`, built without importing torch.

The reproduce dispatcher parses with it before it imports the suite (so `--help` and a wrong invocation answer
in well under a second); pretrain.tasks.suite.main then parses the same arguments again.
"""

from __future__ import annotations

import os

from pretrain.cli import Parser, add_seeds
from pretrain.tasks.presets import METHODS, PRESETS


def tasks_parser() -> Parser:
    """`reproduce --suite tasks`'s arguments."""
    parser = Parser(prog="python -m pretrain reproduce --suite tasks",
                    description="`python -m pretrain reproduce --suite tasks`: every position method on the papers' "
                                "algorithmic tasks.")
    parser.add_argument("--output", default="tasks_out", help="working and report directory (resumable)")
    parser.add_argument("--preset", default="cpu-small", choices=sorted(PRESETS))
    add_seeds(parser)
    parser.add_argument("--tasks", nargs="+", default=None, help="subset of the preset's tasks")
    parser.add_argument("--methods", nargs="+", default=None, help=f"subset of {list(METHODS)}")
    parser.add_argument("--report-only", action="store_true",
                        help="write the report of the runs already evaluated under --output; train nothing")
    parser.add_argument("--merge", nargs="+", metavar="RESULTS_JSON",
                        help="one report under --output of the results.json of suites run in parts (split by task "
                             "or by method); train nothing")
    parser.add_argument("--train-iters", type=int, help="scale down: every task's steps (recorded in the report)")
    parser.add_argument("--eval-count", type=int, help="scale down: held-out examples per length")
    parser.add_argument("--eval-stride", type=int, help="scale down: evaluate every k-th unseen length")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="runs trained / evaluated side by side, each with cores/jobs threads (default: cores)")
    return parser
