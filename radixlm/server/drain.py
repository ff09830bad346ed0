"""Graceful drain on SIGTERM: finish what runs, refuse what comes, then exit 0.

`DrainingServer` is uvicorn's Server with SIGTERM handled in three phases:
  1. stop admitting: `AdmissionControl.draining` makes every new generate request a 503
     and /health a 503 (load balancers and the router take the instance out), while the
     listener stays open so clients get that answer instead of a refused connection;
  2. wait until every request in flight has finished, for up to `--shutdown-timeout` s;
  3. fail whatever is still in flight with a clear 503 error (the scheduler aborts it and
     frees its KV), give the handlers a moment to send those answers, then let uvicorn
     shut down as usual (the launcher then stops the child processes).
The signal is not re-raised afterwards (uvicorn's default), so the process exits 0.
A second SIGTERM, SIGINT, or a dead child process (the engine is unhealthy: nothing
would finish) skips the drain and exits at once.
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


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, tokenizer_manager, shutdown_timeout: float) -> None:
        super().__init__(config)
        self.tm = tokenizer_manager
        self.shutdown_timeout = shutdown_timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task | None = None

    async def serve(self, sockets=None) -> None:  # type: ignore[override]
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        first = not self.tm.admission.draining
        if sig == signal.SIGTERM and first and self.tm.healthy and self._loop is not None:
            self.tm.admission.draining = True
            logger.info("SIGTERM: draining (new requests get 503); %d requests in flight, "
                        "waiting up to %g s", self.tm.num_running, self.shutdown_timeout)
            # A signal handler runs between two bytecodes of the loop's thread: schedule.
            self._loop.call_soon_threadsafe(self._start_drain)
            return
        self.tm.exiting = True  # long-lived streams (/dashboard/events) end now
        if sig == signal.SIGTERM:
            self.should_exit = True  # no re-raise: exit 0
            return
        super().handle_exit(sig, frame)

    def _start_drain(self) -> None:
        self._drain_task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.shutdown_timeout
        while self.tm.num_running and loop.time() < deadline and self.tm.healthy:
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
