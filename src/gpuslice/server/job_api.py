"""The job routes of ``gpuslice serve`` (``server/app.py`` has the table of every route): submit (with an
Idempotency-Key a retry returns the first try's job), list, one job, cancel, and logs, streamed while a
follower waits for more."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Query, Response
from fastapi.responses import StreamingResponse

from gpuslice.errors import InvalidRequest
from gpuslice.server import job_logs
from gpuslice.server.daemon import Daemon
from gpuslice.server.errors import ForbiddenUser, TooManyFollowers
from gpuslice.server.models import (
    ERROR_RESPONSES,
    Decimal,
    ErrorBody,
    JobOut,
    StateName,
    SubmitRequest,
    job_out,
    named,
    spec_from_submit,
)
from gpuslice.workload.job import JobState

__all__ = ["MAX_LOG_FOLLOWERS", "job_router"]

# Followers are coroutines, not threads (a few KiB each); the cap only bounds a client that opens
# connections in a loop.
MAX_LOG_FOLLOWERS = 1000
_IDEMPOTENCY_KEY = r"^[\x21-\x7e]{1,200}$"  # printable ASCII, no spaces: published, and checked (422)


def job_router(daemon: Daemon, authorized: Callable[..., None], stopping: threading.Event) -> APIRouter:
    """The job routes; ``authorized`` guards what changes state, ``stopping`` ends log followers."""
    router = APIRouter()
    auth = Depends(authorized)
    followers = 0

    answers: dict[int | str, dict[str, Any]] = {
        **ERROR_RESPONSES,
        200: {"model": JobOut, "description": "a retry with the same Idempotency-Key and body: its job"},
        503: {
            "model": ErrorBody,
            "description": "the state file is full, locked or failing: nothing was "
            "stored; retry after Retry-After seconds",
        },
    }

    @router.post("/v1/jobs", status_code=201, response_model=JobOut, responses=answers, dependencies=[auth])
    def submit(
        body: SubmitRequest,
        response: Response,
        idempotency_key: Annotated[
            str | None,
            Header(
                max_length=200,
                pattern=_IDEMPOTENCY_KEY,
                description="a retry with the same key and body returns the same job",
            ),
        ] = None,
    ) -> JobOut:
        if body.user is not None and body.user != daemon.user:
            raise ForbiddenUser(
                f"user: this server runs jobs as {daemon.user!r} and never switches users; "
                f"{body.user!r} should start their own server"
            )
        spec = spec_from_submit(body, daemon.user)
        key = None
        if idempotency_key is not None:
            digest = hashlib.sha256(json.dumps(body.model_dump(), sort_keys=True).encode()).hexdigest()
            key = (idempotency_key, digest)
        try:
            job, created = daemon.submit_once(spec, key)
        except InvalidRequest as err:  # the scheduler's "can never run here", with its field named
            raise named(err) from None
        if not created:
            response.status_code = 200  # a retry: the job the first try made
        return job_out(job)

    @router.get("/v1/jobs", response_model=list[JobOut], responses=ERROR_RESPONSES)
    def list_jobs(
        state: Annotated[list[StateName] | None, Query()] = None,
        tenant: str | None = None,
        limit: Annotated[int, Query(ge=1, le=10_000), Decimal] = 1000,
    ) -> list[JobOut]:
        states = [JobState(s) for s in state] if state else None
        jobs = daemon.store.jobs(states, tenant=tenant, limit=limit, newest_first=True)
        waiting = daemon.views.pending_reasons()  # a pending job's reason is why it waits now
        return [job_out(j, waiting.get(j.id)) for j in jobs]

    @router.get("/v1/jobs/{job_id}", response_model=JobOut, responses=ERROR_RESPONSES)
    def get_job(job_id: str) -> JobOut:
        return job_out(daemon.store.get(job_id), daemon.views.pending_reasons().get(job_id))

    @router.post(
        "/v1/jobs/{job_id}/cancel", response_model=JobOut, responses=ERROR_RESPONSES, dependencies=[auth]
    )
    def cancel(job_id: str) -> JobOut:
        return job_out(daemon.cancel(job_id))

    text = {200: {"content": {"text/plain": {}}}}

    @router.get("/v1/jobs/{job_id}/logs", responses={**text, **ERROR_RESPONSES, 429: {}})
    async def logs(
        job_id: str,
        follow: bool = False,
        stream: Literal["stdout", "stderr", "both"] = "both",
    ) -> StreamingResponse:
        """Async: a follower is a coroutine waiting on a timer, never a worker thread, and a client
        that goes away cancels it at once (Starlette watches for the disconnect)."""
        nonlocal followers
        daemon.store.get(job_id)  # 404 before streaming starts
        if follow and followers >= MAX_LOG_FOLLOWERS:
            raise TooManyFollowers(f"{followers} clients follow logs already; try again later")
        # Opened now, never through a link: a refused log is a 409 before any byte is sent.
        logs = job_logs.open_logs(daemon, job_id, ("stdout", "stderr") if stream == "both" else (stream,))
        if not follow:
            return StreamingResponse(job_logs.follow(daemon, job_id, logs, None), media_type="text/plain")
        followers += 1

        async def counted() -> AsyncIterator[bytes]:
            nonlocal followers
            try:
                async for chunk in job_logs.follow(daemon, job_id, logs, stopping):
                    yield chunk
            finally:
                followers -= 1

        return StreamingResponse(counted(), media_type="text/plain")

    return router
