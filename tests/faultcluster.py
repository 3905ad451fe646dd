"""Several daemons on one PostgreSQL, each behind its own fault proxy, and the faults a
test can apply to them: the network's (tests/faultproxy.py), the processes' (SIGSTOP and
SIGCONT, kill -9) and the database's (a restart). The `cluster` fixture (registered in
tests/conftest.py) makes one on a fresh database of the private server; its jobs record
their runs (tests/faultchecks.py) for the checkers.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpusched.store import Store
from tests.cluster_harness import cluster_config
from tests.daemon_harness import RunningDaemon
from tests.faultchecks import History
from tests.faultproxy import FaultProxy
from tests.postgres import TEMPLATE, PostgresServer

SLACK_S = 10.0  # a shared, loaded test machine; the faults themselves last far longer
GIB = 2**30
CARD = 24 * GIB  # the daemons' simulated GPUs: 2 x 24G each


class Cluster:
    def __init__(self, server: PostgresServer, database: str, factory: Any, root: Path) -> None:
        self.server = server
        self.database = database
        self.factory = factory
        self.proxies: dict[str, FaultProxy] = {}
        self.daemons: dict[str, RunningDaemon] = {}
        self.history = History(root)
        self.declared: dict[int, float] = {}
        self.store = Store(server.url(database))  # the test's own view, never through a proxy

    def node(self, name: str, **extra: Any) -> RunningDaemon:
        proxy = self.proxies.setdefault(name, FaultProxy(self.server.port))
        url = self.server.tcp_url(self.database, proxy.port)
        daemon = self.factory(
            name,
            config=cluster_config(url, name, **extra),
            env={"PGPASSWORD": self.server.password},
        )
        self.daemons[name] = daemon.start().wait_gpus_reported(name)
        return daemon

    def submit(self, via: RunningDaemon, seconds: float, mem_g: int = 10, *more: str) -> int:
        job_id = via.submit("--mem", f"{mem_g}G", *more, "--", *self.history.job(seconds))
        self.declared[job_id] = mem_g * GIB
        return job_id

    def scheduler(self) -> str:
        """The node holding the scheduler's election (as the database says)."""
        with self.store.database.read() as conn:
            row = conn.exec_driver_sql("SELECT holder FROM leases").first()
        assert row is not None
        return str(row[0]).split(" ")[0].split("@")[0]

    def states(self, ids: list[int]) -> dict[int, str]:
        return {job_id: self.store.jobs.get(job_id).state.value for job_id in ids}

    def abandoned_backends(self, older_than_s: float) -> list[tuple[Any, ...]]:
        """The database's sessions waiting on their client inside a transaction for
        longer than `older_than_s` (as a pipeline cut before its Sync leaves one):
        (pid, seconds, left(query, 80)) each."""
        with self.store.database.read() as conn:
            rows = conn.exec_driver_sql(
                "SELECT pid, extract(epoch FROM now() - state_change), left(query, 80)"
                " FROM pg_stat_activity WHERE datname = current_database()"
                " AND state = 'active' AND wait_event = 'ClientRead'"
                " AND xact_start IS NOT NULL"
                " AND state_change < now() - make_interval(secs => %(s)s)",
                {"s": older_than_s},
            ).all()
        return [tuple(row) for row in rows]

    def diagnose(self, stuck: list[int]) -> str:
        """Why jobs did not end, for a failure report: each stuck job's row, earlier runs
        and recorded runs; each node's row (epoch, state, last heard: its last pass), its
        daemon's process (running, stopped by SIGSTOP, gone) and its proxy (healed or
        not); the election and the head's claim; the queue as the database has it (a
        placed job has its node); what each daemon's log says of those jobs, and its
        warnings; the database's other sessions, their transactions and whom they wait for."""
        lines = []
        columns = (
            "id, state, node, node_epoch, pid, gpu_uuids, started_at, requeue, stop_intent,"
            " waiting_reason"
        )
        with self.store.database.read() as conn:
            rows = conn.exec_driver_sql(
                f"SELECT {columns} FROM jobs WHERE id = ANY(%(ids)s) ORDER BY id",  # noqa: S608
                {"ids": stuck},
            ).all()
            queue = conn.exec_driver_sql(
                "SELECT id, node FROM jobs WHERE state = 'queued' ORDER BY id"
            ).all()
            mark = conn.exec_driver_sql("SELECT sum(n), count(*) FROM queue_marks").first()
            # Every other session of the database, and whom it waits for: a lock held by a
            # session that never ends stalls every node's pass alike.
            sessions = conn.exec_driver_sql(
                "SELECT pid, application_name, client_addr, client_port, backend_start,"
                " xact_start, state_change, state, wait_event_type, wait_event,"
                " pg_blocking_pids(pid), left(query, 160) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " ORDER BY xact_start NULLS LAST"
            ).all()
        runs = [r for r in self.history.runs() if r.job in stuck]
        earlier = self.store.attempts.earlier_runs(stuck)
        for row in rows:
            job = dict(zip(columns.replace(" ", "").split(","), row, strict=True))
            pid = job["pid"]
            alive = pid is not None and Path(f"/proc/{pid}").exists()
            lines.append(f"job {job} (pid alive: {alive})")
            lines += [f"  earlier run: {a}" for a in earlier.get(int(job["id"]), [])]
            lines += [f"  recorded run: {r}" for r in runs if r.job == job["id"]]
        for node in self.store.nodes.node_rows():
            lines.append(
                f"node {node.name}: epoch {node.epoch}, {node.state}, heard {node.age_s:.1f}s"
                f" ago{' (expired)' if node.expired else ''}, owner {node.owner};"
                f" daemon {self._process_state(node.name)}; proxy {self._proxy_state(node.name)}"
            )
        lines.append(f"election: {self.store.nodes.scheduler_lease()}")
        lines.append(f"head claim (policy rule 1): {self.store.head_claims.current()}")
        lines.append(f"queue (id, node): {[tuple(q) for q in queue]}; marker {tuple(mark or ())}")
        lines.append("database sessions (oldest transaction first):")
        lines += [f"  {tuple(session)}" for session in sessions]
        for name, daemon in self.daemons.items():
            said = [
                line
                for line in daemon.stderr().splitlines()
                if any(f"job {i} " in line or f"job {i}:" in line for i in stuck)
                or " WARNING " in line
                or " ERROR " in line
            ]
            lines.append(f"daemon {name}'s log on those jobs, and its warnings (last 25):")
            lines += [f"  {line}" for line in said[-25:]]
        return "\n".join(lines)

    def _process_state(self, name: str) -> str:
        daemon = self.daemons.get(name)
        process = None if daemon is None else daemon.process
        if process is None or process.poll() is not None:
            return "not running"
        try:
            state = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return "gone"
        return f"pid {process.pid} " + ("STOPPED" if state in ("T", "t") else f"state {state}")

    def _proxy_state(self, name: str) -> str:
        proxy = self.proxies.get(name)
        return "none" if proxy is None else proxy.describe()

    def check(self, requeue: set[int] | None = None) -> None:
        assert self.history.double_starts(requeue or set()) == {}
        assert self.history.overcommit(self.declared, CARD) == []

    # -- the processes' faults ------------------------------------------------------------

    def pid(self, name: str) -> int:
        process = self.daemons[name].process
        assert process is not None, f"daemon {name} is not running"
        return process.pid

    def pause(self, name: str) -> None:
        """SIGSTOP: a frozen daemon (its connections stay open, its leases run out)."""
        os.kill(self.pid(name), signal.SIGSTOP)

    def resume(self, name: str) -> None:
        os.kill(self.pid(name), signal.SIGCONT)

    def kill9(self, name: str) -> None:
        """kill -9 the daemon only: its supervisors and jobs run on, as after a crash."""
        daemon = self.daemons[name]
        assert daemon.process is not None
        daemon.process.kill()
        daemon.process.wait()
        daemon.process = None

    def restart(self, name: str) -> RunningDaemon:
        """Start the daemon named `name` again (after kill9 or a stop), same node name."""
        return self.daemons[name].start()

    def restart_database(self, mode: str = "fast") -> None:
        self.server.restart(mode)

    def close(self) -> None:
        for proxy in self.proxies.values():
            proxy.heal()
        self.store.close()

    def tear_down(self) -> None:
        """Everything the cluster made, gone: daemons (a stopped one resumed first, or it
        would not hear SIGTERM), their jobs, the proxies and the database."""
        self.close()
        for name, daemon in self.daemons.items():
            if daemon.process is not None and daemon.process.poll() is None:
                self.resume(name)
            daemon.stop()
            daemon.kill_jobs()
        for proxy in self.proxies.values():
            proxy.close()
        self.server.drop_database(self.database)


@pytest.fixture
def cluster(
    postgres_server: PostgresServer, daemon_factory: Any, tmp_path: Path
) -> Iterator[Cluster]:
    """Daemons on a fresh database of the private PostgreSQL, each behind its proxy."""
    database = postgres_server.create_database(template=TEMPLATE)
    made = Cluster(postgres_server, database, daemon_factory, tmp_path)
    try:
        yield made
    finally:
        made.tear_down()
