"""Per-rank GPU progress in the hang report: under NCCL every rank's host can reach the same sync while one rank's
GPU has not finished its work; the CUDA event recorded when each phase ends names that rank. Simulated on CPU by
an event source whose events stop completing (a stalled stream); without CUDA nothing is recorded. ~0 s."""

from pathlib import Path

from pretrain.trainer.device_progress import DeviceProgress
from pretrain.trainer.hang_diagnosis import Observer, StepCounters, diagnose


class Stream:
    """A device stream: events recorded on it complete until it stalls; after that, none does."""

    def __init__(self):
        self.stalled = False

    def event(self):
        stream = self

        class Event:
            def record(self):
                self.done = not stream.stalled

            def query(self):
                return self.done
        return Event()


def rank_counters(stream: Stream) -> StepCounters:
    return StepCounters(step=4, device=DeviceProgress(stream.event))


def run_step_5(counters: StepCounters) -> None:
    for phase in ("forward-backward", "gradient sync", "optimizer"):
        counters.enter(phase)


def heartbeats(counters: list[StepCounters], beat: int) -> dict[int, dict]:
    return {rank: {"beat": beat, "host": f"node{rank}", **c.record()} for rank, c in enumerate(counters)}


def test_a_rank_whose_gpu_events_stop_is_named_though_every_host_waits_at_the_same_place(tmp_path):
    streams = [Stream() for _ in range(4)]
    counters = [rank_counters(s) for s in streams]
    for rank, c in enumerate(counters):
        c.enter("forward-backward")
        streams[rank].stalled = rank == 2  # rank 2's GPU stalls inside step 5's forward-backward
        c.enter("gradient sync")
        c.enter("optimizer")
    observer = Observer(0, 4, "node0", Path(tmp_path), hosts={r: f"node{r}" for r in range(4)})
    verdict = diagnose(observer, 4, "step 5", "parallel.train_timeout_seconds", 20, heartbeats(counters, 1),
                       heartbeats(counters, 2))
    assert verdict.named == [2], verdict.line
    assert "rank 2 on node2" in verdict.line and "its GPU has not finished" in verdict.line, verdict.line
    assert "forward-backward of step 5" in verdict.line, verdict.line


def test_with_every_gpu_done_the_report_says_every_rank_waits_at_the_same_place(tmp_path):
    counters = [rank_counters(Stream()) for _ in range(4)]
    for c in counters:
        run_step_5(c)
    verdict = diagnose(Observer(0, 4, "node0", Path(tmp_path)), 4, "step 5", "parallel.train_timeout_seconds", 20,
                       heartbeats(counters, 1), heartbeats(counters, 2))
    assert verdict.named == [] and "every rank still reports and waits at the same place" in verdict.line


def test_without_cuda_nothing_is_recorded_and_heartbeats_carry_nothing_of_it():
    counters = StepCounters(step=4)
    run_step_5(counters)
    assert "gpu_pending" not in counters.record() and not counters.device.used
