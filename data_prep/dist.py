"""Multi-node coordination through MPI (mpirun / srun --mpi=pmix + mpi4py), or a single process."""

from __future__ import annotations

import os
import sys
from typing import Any

_MPI_ENV = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK", "MPI_LOCALNRANKS")


class Comm:
    """The few collectives the pipeline needs; a no-op stand-in when there is one rank."""

    def __init__(self, mpi_comm=None) -> None:
        self._c = mpi_comm
        self.rank = mpi_comm.Get_rank() if mpi_comm else 0
        self.size = mpi_comm.Get_size() if mpi_comm else 1

    def barrier(self) -> None:
        """Wait for every rank."""
        if self._c:
            self._c.Barrier()

    def bcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        return self._c.bcast(obj, root=0) if self._c else obj

    def gather(self, obj: Any) -> list | None:
        """Every rank's `obj` on rank 0 (None elsewhere)."""
        return self._c.gather(obj, root=0) if self._c else [obj]

    def allreduce_max(self, value: int) -> int:
        """Largest `value` over ranks (used to agree on failure)."""
        if not self._c:
            return value
        from mpi4py import MPI

        return self._c.allreduce(value, op=MPI.MAX)

    def abort(self, code: int = 1) -> None:
        """Stop every rank (a failed rank must not leave the others waiting in a barrier)."""
        if self._c:
            self._c.Abort(code)
        sys.exit(code)


def launched_by_mpi() -> bool:
    """True when this process was started by mpirun/srun with an MPI environment."""
    return any(k in os.environ for k in _MPI_ENV)


def get_comm(use_mpi: bool | None = None) -> Comm:
    """MPI world communicator when launched under MPI (or `use_mpi`), else a single-rank Comm."""
    if use_mpi is False or (use_mpi is None and not launched_by_mpi()):
        return Comm()
    try:
        from mpi4py import MPI
    except ImportError as e:
        if use_mpi:
            raise RuntimeError("--mpi needs mpi4py (pip install mpi4py; apt-get install libopenmpi-dev)") from e
        return Comm()
    world = MPI.COMM_WORLD
    return Comm(world if world.Get_size() > 1 else None)
