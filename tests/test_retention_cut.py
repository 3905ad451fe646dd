"""A node's retention pass cut off from the shared PostgreSQL while it holds the
cluster-wide submit lock (its deletion of the environments no job uses any more) holds
up the other nodes' submits for a moment only, not until the server's
idle_in_transaction_session_timeout (docs/cluster.md section 1: 10 s) ends its session.

The private PostgreSQL (tests/postgres.py) with that production bound, the cut node's
store behind a fault proxy (tests/faultproxy.py) that goes silent right after the
pass's DELETE of environments answers, inside its transaction; the other node's store
connects directly.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest

from gpusched.config.retention import RetentionSettings
from gpusched.core.clock import iso, utc_now
from gpusched.core.models import JobState
from gpusched.store import NewJob, Store
from gpusched.store.retention import prune
from tests.faultproxy import FaultProxy
from tests.postgres import SERVER_BOUNDS, TEMPLATE, PostgresServer

# docs/cluster.md section 1's value; the tests' own (2 s) would hide the wait.
PRODUCTION_BOUNDS = {**SERVER_BOUNDS, "idle_in_transaction_session_timeout": "10s"}


def _new(env: dict[str, str]) -> NewJob:
    return NewJob(
        user="alice", uid=1000, gid=1000, command=["true"], cwd="/", env=env, umask=0o022, mem=None
    )


@pytest.fixture
def database(postgres_server: PostgresServer) -> Iterator[str]:
    name = postgres_server.create_database(template=TEMPLATE, bounds=PRODUCTION_BOUNDS)
    try:
        yield name
    finally:
        postgres_server.drop_database(name)


def test_a_retention_pass_cut_off_holding_the_submit_lock_holds_up_submits_only_briefly(
    postgres_server: PostgresServer, database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGPASSWORD", postgres_server.password)  # over TCP, as a node
    proxy = FaultProxy(postgres_server.port)
    cut_off = Store(postgres_server.tcp_url(database, proxy.port))
    other = Store(postgres_server.url(database))
    pruning = None
    try:
        # A job that ended 8 days ago: the pass drops its environment (kept 7 days), then
        # deletes the stored one nobody uses any more, under the submit lock.
        old = other.jobs.add(_new({"RUN": "old"}), iso(utc_now() - timedelta(days=8)))
        ended = iso(utc_now() - timedelta(days=8))
        assert other.jobs.mark_ended(old.id, state=JobState.DONE, reason="exit", now=ended)
        cut = proxy.cut_inside_transaction("DELETE FROM envs")

        def retention_pass() -> None:
            with contextlib.suppress(Exception):  # its COMMIT's answer never comes
                prune(cut_off.database, RetentionSettings(), time.time())

        pruning = threading.Thread(target=retention_pass, daemon=True)
        pruning.start()
        assert cut.wait(30), proxy.describe()
        # The cut node's transaction is open, its locks held, its client silent: a submit
        # on another node waits for the submit lock up to the server's lock_timeout (2 s).
        job = other.jobs.add(_new({"PATH": "/usr/bin"}), iso(utc_now()))
        assert other.jobs.get(job.id).state == JobState.QUEUED
    finally:
        proxy.heal()
        if pruning is not None:
            pruning.join(timeout=30)
        cut_off.close()
        other.close()
        proxy.close()
