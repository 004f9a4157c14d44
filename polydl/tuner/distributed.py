"""Distributed tuning on Ray: workers measure, the driver process alone writes the database.

`local_executor(workers)` starts a Ray cluster on this machine with no configuration and gives
each of `workers` actors its own share of the cores, pinned (the target each worker times for
has that many cores); `cluster_executor(address)` joins an existing cluster and places one
actor on every node, each timing with the target's core count. Ray is the optional extra
`polydl[tune]`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

from polydl.errors import PolyDLError
from polydl.target.cpu import CpuTarget
from polydl.tuner.measure import Outcome, Request, measure
from polydl.tuner.processes import POOL


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise PolyDLError("distributed tuning (--workers, --ray) needs Ray: pip install "
                          "'polydl[tune]' (without them, tuning runs in this process)") from None
    return ray


class MeasureWorker:
    """One Ray actor: measures requests on its cores (None: whatever the node gives it)."""

    def __init__(self, cpus: tuple[int, ...] | None) -> None:
        self.cpus = cpus

    def measure(self, request: Request) -> list[Outcome]:
        return measure(replace(request, cpus=self.cpus))

    def prestart(self, threads: int) -> None:
        POOL.prestart(self.cpus, threads)

    def node(self) -> tuple[str, int]:
        return os.uname().nodename, len(os.sched_getaffinity(0))


class RayExecutor:
    def __init__(self, actors: list[Any]) -> None:
        self.actors = actors
        self.slots = len(actors)

    def parts(self) -> list[RayExecutor]:
        return [RayExecutor([actor]) for actor in self.actors]

    def run(self, requests: Sequence[Request]) -> Iterator[tuple[int, list[Outcome]]]:
        ray = _ray()
        free = list(self.actors)
        queue = list(enumerate(requests))
        running: dict[Any, tuple[int, Any]] = {}
        while queue or running:
            while queue and free:
                index, request = queue.pop(0)
                actor = free.pop()
                running[actor.measure.remote(request)] = (index, actor)
            ready, _ = ray.wait(list(running), num_returns=1)
            index, actor = running.pop(ready[0])
            free.append(actor)
            yield index, ray.get(ready[0])

    def prestart(self, target: CpuTarget) -> None:
        """Have every actor start its measuring process now (asynchronously)."""
        for actor in self.actors:
            actor.prestart.remote(target.cores)

    def shutdown(self) -> None:
        _ray().shutdown()


def worker_cpus(workers: int) -> list[tuple[int, ...]]:
    """This process's cores split into `workers` equal, disjoint shares."""
    mine = sorted(os.sched_getaffinity(0))
    if workers < 1:
        raise PolyDLError(f"--workers must be at least 1, not {workers}")
    if workers > len(mine):
        raise PolyDLError(f"--workers {workers}: this machine gives polydl {len(mine)} cores, "
                          "one per worker at most")
    share = len(mine) // workers
    return [tuple(mine[i * share:(i + 1) * share]) for i in range(workers)]


def local_executor(workers: int, target: CpuTarget) -> tuple[RayExecutor, CpuTarget]:
    """A local Ray cluster of `workers` pinned actors, and the target they time for (the
    given one with each worker's share of the cores)."""
    shares = worker_cpus(workers)
    ray = _ray()
    ray.init(num_cpus=sum(len(s) for s in shares), include_dashboard=False,
             log_to_driver=False, configure_logging=False, ignore_reinit_error=True)
    actor = ray.remote(MeasureWorker)
    actors = [actor.options(num_cpus=len(s)).remote(s) for s in shares]
    return RayExecutor(actors), replace(target, cores=len(shares[0]))


def cluster_executor(address: str, target: CpuTarget) -> RayExecutor:
    """One actor per alive node of the Ray cluster at `address`, each with the target's
    number of cores (a node with fewer is an error: its times would be for another target)."""
    ray = _ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    try:
        ray.init(address=address, log_to_driver=False, configure_logging=False,
                 ignore_reinit_error=True)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise PolyDLError(f"cannot join the Ray cluster at {address}: {exc}") from None
    actor = ray.remote(MeasureWorker)
    actors = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        cpus = int(node.get("Resources", {}).get("CPU", 0))
        if cpus < target.cores:
            raise PolyDLError(f"Ray node {node.get('NodeManagerAddress')} offers {cpus} CPUs, "
                              f"fewer than the target's {target.cores} cores")
        strategy = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        actors.append(actor.options(num_cpus=target.cores, scheduling_strategy=strategy).remote(None))
    if not actors:
        raise PolyDLError(f"the Ray cluster at {address} has no alive node")
    return RayExecutor(actors)
