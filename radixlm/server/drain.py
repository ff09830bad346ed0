"""Graceful drain on SIGTERM or SIGINT: finish what runs, refuse what comes, then exit 0.

The signal may reach the API process alone or the whole process group (systemd's
KillMode=control-group, Ctrl-C in a terminal): the children ignore both
(`process_utils.leave_shutdown_to_parent`) and are stopped by the launcher afterwards.
`DrainingServer` is uvicorn's Server with the first SIGTERM/SIGINT handled in three phases:
  1. stop admitting: `AdmissionControl.draining` makes every new generate request a 503
     and /health a 503 (load balancers and the router take the instance out), while the
     listener stays open so clients get that answer instead of a refused connection;
  2. wait until every request in flight has finished, for up to `--shutdown-timeout` s;
  3. fail whatever is still in flight with a clear 503 error (the scheduler aborts it and
     frees its KV), give the handlers a moment to send those answers, then let uvicorn
     shut down as usual (the launcher then stops the child processes).
The signal is not re-raised (as uvicorn would), so the process exits 0. A second
signal, or a dead child (nothing would finish), skips the drain and exits at once.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from types import FrameType

import uvicorn

logger = logging.getLogger(__name__)

POLL_S = 0.05
ANSWER_GRACE_S = 0.5  # for the failed requests' handlers to send their error answers
_DRAIN_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, tokenizer_manager, shutdown_timeout: float) -> None:
        super().__init__(config)
        self.tm = tokenizer_manager
        self.shutdown_timeout = shutdown_timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task | None = None
        self._signals = 0  # SIGTERM/SIGINT received so far

    async def serve(self, sockets=None) -> None:  # type: ignore[override]
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig not in _DRAIN_SIGNALS:
            super().handle_exit(sig, frame)
            return
        self._signals += 1
        first = self._signals == 1
        if first and self.tm.healthy and self._loop is not None:
            self.tm.admission.draining = True
            logger.info("%s: draining (new requests get 503); %d requests in flight, "
                        "waiting up to %g s", signal.Signals(sig).name, self._in_flight(),
                        self.shutdown_timeout)
            # A signal handler runs between two bytecodes of the loop's thread: schedule.
            self._loop.call_soon_threadsafe(self._start_drain)
            return
        self.tm.exiting = True  # long-lived streams (/dashboard/events) end now
        # Not re-raised (uvicorn would re-raise it after serving): exit 0.
        if not first:  # a second signal: stop at once, without waiting for connections
            logger.warning("%s again: stopping now", signal.Signals(sig).name)
            self.force_exit = True
        self.should_exit = True

    def _in_flight(self) -> int:
        """Requests sent to the scheduler, or admitted and about to be."""
        return max(self.tm.num_running, self.tm.admission.in_flight)

    def _start_drain(self) -> None:
        self._drain_task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.shutdown_timeout
        while self._in_flight() and loop.time() < deadline and self.tm.healthy:
            await asyncio.sleep(POLL_S)
        left = self.tm.num_running
        if left:
            self.tm.abort_all(f"The server shut down before this request finished (it was "
                              f"still running after --shutdown-timeout "
                              f"{self.shutdown_timeout:g} s); retry it.", 503)
            logger.warning("drain: aborted %d requests still in flight after %g s", left,
                           self.shutdown_timeout)
            await asyncio.sleep(ANSWER_GRACE_S)
        else:
            logger.info("drain: every request finished")
        self.tm.exiting = True
        self.should_exit = True
