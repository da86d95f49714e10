"""Under torchrun (gloo, CPU): rank 1 stops itself (SIGSTOP) before its watchdog sends a heartbeat; rank 0's
watchdog, with a 2 s start-up timeout, must report it and SIGKILL it by its launch environment.

Used by tests/trainer/test_hang_before_heartbeat.py. Argument: the run directory.
"""

import os
import signal
import sys
import time

import torch.distributed as dist

from pretrain.trainer.watchdog import Watchdog

dist.init_process_group("gloo")
if dist.get_rank() == 1:
    with open(f"{sys.argv[1]}.stopped_at", "w") as handle:  # the test times the end of the job from here
        handle.write(str(time.time()))
    os.kill(os.getpid(), signal.SIGSTOP)  # what a peer sees of a rank stuck in start-up before its watchdog
Watchdog(sys.argv[1], 10, startup_timeout_s=2.0, train_timeout_s=20.0).start()
time.sleep(120)  # the watchdog ends this process (HANG_EXIT_CODE) long before
