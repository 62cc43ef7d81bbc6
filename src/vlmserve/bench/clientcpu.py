"""How busy the bench's own processes were: part of the proof the client was not the bottleneck.

Each worker's CPU time over the run's wall time is its busy fraction (1.0 = one core
fully used; an asyncio worker cannot use more). Per-second samples give the peak.
"""

from __future__ import annotations

import asyncio
import time

import psutil

from vlmserve.async_tasks import cancel_and_wait
from vlmserve.results.blocks import ClientCpu


class ClientCpuMonitor:
    """Samples CPU use of the given processes once a second while the load runs."""

    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self.processes: dict[int, psutil.Process] = {}
        self.start_times: dict[int, float] = {}
        self.end_times: dict[int, float] = {}
        self.peaks: dict[int, float] = {}
        self.started = 0.0
        self.ended = 0.0
        self._task: asyncio.Task | None = None

    @staticmethod
    def _cpu_s(process: psutil.Process) -> float:
        times = process.cpu_times()
        return times.user + times.system

    def watch(self, pids: list[int]) -> None:
        """Start measuring these processes (the workers, or this process when in-process)."""
        self.started = time.monotonic()
        for pid in pids:
            try:
                process = psutil.Process(pid)
                self.processes[pid] = process
                self.start_times[pid] = self._cpu_s(process)
                process.cpu_percent(None)
            except psutil.Error:
                continue
        self._task = asyncio.get_running_loop().create_task(self._sample())

    async def _sample(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            for pid, process in self.processes.items():
                try:
                    busy = process.cpu_percent(None) / 100.0
                    self.end_times[pid] = self._cpu_s(process)
                except psutil.Error:
                    continue
                self.peaks[pid] = max(self.peaks.get(pid, 0.0), busy)

    async def stop(self) -> None:
        self.ended = time.monotonic()
        for pid, process in self.processes.items():
            try:
                self.end_times[pid] = self._cpu_s(process)
            except psutil.Error:
                pass  # the worker has exited: keep its last sample
        await cancel_and_wait(self._task)

    def summary(self) -> ClientCpu:
        wall = max(self.ended - self.started, 1e-9)
        busy = {
            str(index): (self.end_times.get(pid, self.start_times[pid]) - self.start_times[pid]) / wall
            for index, pid in enumerate(self.processes)
        }
        peaks = {str(index): self.peaks.get(pid, 0.0) for index, pid in enumerate(self.processes)}
        return ClientCpu(
            processes=len(self.processes),
            worker_busy_fraction=busy,
            worker_peak_busy_fraction=peaks,
            total_cpu_s=sum(self.end_times.get(pid, self.start_times[pid]) - self.start_times[pid] for pid in self.processes),
            machine_cores=psutil.cpu_count() or 1,
        )
