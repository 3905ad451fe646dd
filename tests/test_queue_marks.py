"""The queue's change marker (issue 30, gpusched.store.queue_marks): a pass over a queue
that did not change reads one number, not every queued row; and every write that changes
the queue as a pass reads it, by any writer (another Store on the same database: another
process or node), is seen by the next read. On SQLite and PostgreSQL (the `store` fixture).
Counted by the statements the store sends, never timed (benchmarks/scheduling_pass.py)."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import event, text

from gpusched.store import NodePlacement, Queued, Store, queue_marks
from tests.test_store import NOW, new_job, start


@pytest.fixture
def queue_reads(store: Store) -> Iterator[Callable[[], int]]:
    """How many times `store` has read the queued rows so far."""
    seen: list[str] = []

    def note(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if "FROM jobs" in statement and "jobs.node IS NULL" in statement:
            seen.append(statement)

    event.listen(store.database.engine, "before_cursor_execute", note)
    yield lambda: len(seen)
    event.remove(store.database.engine, "before_cursor_execute", note)


@pytest.fixture
def other(database_url: str) -> Iterator[Store]:
    """A second writer on the same database (another daemon, or another node)."""
    second = Store(database_url)
    yield second
    second.close()


def _ids(store: Store) -> list[int]:
    return [job.id for job in store.jobs.queued()]


def test_an_unchanged_queue_is_not_read_again(store: Store, queue_reads: Callable[[], int]) -> None:
    ids = [store.jobs.add(new_job(), NOW).id for _ in range(3)]
    assert _ids(store) == ids
    reads = queue_reads()
    for _ in range(5):
        assert _ids(store) == ids
    assert queue_reads() == reads
    # What a pass writes of a waiting job and does not read (its reason) changes nothing.
    store.placements.set_waiting_reasons({ids[0]: "waiting for a card"})
    assert _ids(store) == ids
    assert queue_reads() == reads
    # A change that is not in the queue (a running job's pid) neither.
    running = store.jobs.add(new_job(), NOW).id
    store.jobs.queued()
    reads = queue_reads()
    assert start(store, running)
    reads += 1  # leaving the queue is a change of it
    assert _ids(store) == ids
    assert queue_reads() == reads
    assert store.jobs.set_pid(running, 777, "1")
    assert _ids(store) == ids
    assert queue_reads() == reads


def _changes(store: Store, writer: Store) -> list[tuple[str, Callable[[], None]]]:
    """Each write that changes the queue, done by `writer`, and what `store` must see."""
    a, b, c = (writer.jobs.add(new_job(), NOW).id for _ in range(3))
    running = writer.jobs.add(new_job(), NOW).id

    def check_priority() -> None:
        assert writer.jobs.set_priority(b, 5)
        assert {j.id: j.priority for j in store.jobs.queued()}[b] == 5

    def check_top() -> None:
        assert writer.jobs.put_first(c)
        assert {j.id: j.top for j in store.jobs.queued()}[c] is not None

    def check_hold_release() -> None:
        assert writer.jobs.hold(a)
        assert a not in _ids(store)
        assert writer.jobs.release(a)
        assert a in _ids(store)

    def check_start_and_back() -> None:
        assert start(writer, running)
        assert running not in _ids(store)
        assert writer.jobs.unmark_running(running)
        assert running in _ids(store)

    def check_submit() -> None:
        new = writer.jobs.add(new_job(priority=3, after=(a,)), NOW).id
        found = {j.id: j for j in store.jobs.queued()}
        assert found[new].priority == 3 and found[new].after == [a]

    def check_cancel() -> None:
        writer.jobs.cancel_waiting(1000, None, "cancelled", NOW, False)
        assert _ids(store) == []

    return [
        ("priority", check_priority),
        ("top", check_top),
        ("hold and release", check_hold_release),
        ("start and back", check_start_and_back),
        ("submit", check_submit),
        ("cancel", check_cancel),
    ]


@pytest.mark.parametrize("by", ["itself", "another writer"])
def test_every_change_of_the_queue_is_seen_by_the_next_read(
    store: Store, other: Store, by: str
) -> None:
    writer = store if by == "itself" else other
    store.jobs.queued()  # a read to keep, which each change must not outlive
    for _what, check in _changes(store, writer):
        check()
        assert store.jobs.queued() == other.jobs.queued()  # and again, now unchanged


def test_a_write_of_any_column_a_pass_reads_is_seen(
    store: Store, other: Store, database_url: str
) -> None:
    """Whatever writes it (here plain SQL, as an administrator might), a change of any
    column of `Queued` moves the marker: the triggers' columns cover the dataclass."""
    job = store.jobs.add(new_job(name="n"), NOW).id
    before = store.jobs.queued()[0]
    values = {
        "user": "'bob'",
        "uid": "1001",
        "name": "'m'",
        "command": "'[\"true\"]'",
        "mem": "1",
        "gpus": "2",
        "priority": "4",
        "after": "'[1]'",
        "array_id": "9",
        "max_concurrent": "2",
        "retry_of": "3",
        "interactive": "1",
        "allowed_nodes": "'[\"x\"]'",
        "after_when": "'[\"any\"]'",
        "time_limit_s": "60",
        "submitted_at": "'2025-01-02T00:00:00+00:00'",
        "exclusive": "1",
        "share": "1",
        "top": "1",
        "ram": "1073741824",
        "cpus": "2",
    }
    fields = {f.name for f in dataclasses.fields(Queued)} - {"id", "command_json"}
    assert set(values) == fields | {"command"}
    for column, value in values.items():
        with other.database.engine.begin() as conn:
            update = f'UPDATE jobs SET "{column}" = {value} WHERE id = :id'  # noqa: S608 (ours)
            conn.execute(text(update), {"id": job})
        now = store.jobs.queued()[0]
        assert now != before, column
        before = now
    with other.database.engine.begin() as conn:
        conn.execute(text("DELETE FROM jobs WHERE id = :id"), {"id": job})
    assert store.jobs.queued() == ()


def test_the_triggers_cover_every_column_a_pass_reads() -> None:
    revision = importlib.import_module("gpusched.store.migrations.versions.0021_host_ask")
    read = {f.name for f in dataclasses.fields(Queued)} - {"command_json"} | {"command"}
    assert read | {"state", "node"} <= set(revision.QUEUE_COLUMNS)


def test_a_placement_and_its_return_move_the_marker(store: Store) -> None:
    """In a cluster, a placed job leaves the queue the elected scheduler reads, and comes
    back when its node gives it back."""
    job = store.jobs.add(new_job(), NOW).id
    assert _ids(store) == [job]
    _cluster_of_one(store)
    placement = NodePlacement(job, "n1", ("GPU-1",), (0,))
    assert store.placements.place([placement], "n1", 1) == [job]
    assert _ids(store) == []
    assert store.placements.unplace(job, "n1")
    assert _ids(store) == [job]


def test_without_its_triggers_the_queue_is_read_in_full_each_time(
    database_url: str, store: Store
) -> None:
    """When unsure, read in full: a database that lost a trigger gives no marker."""
    job = store.jobs.add(new_job(), NOW).id
    with store.database.engine.begin() as conn:
        on = " ON jobs" if conn.dialect.name == "postgresql" else ""
        conn.execute(text(f"DROP TRIGGER jobs_queue_update{on}"))
    fresh = Store(database_url)
    try:
        assert [j.id for j in fresh.jobs.queued()] == [job]
        assert store.jobs.set_priority(job, 2)  # no trigger to say so
        assert [j.priority for j in fresh.jobs.queued()] == [2]
    finally:
        fresh.close()


def _cluster_of_one(store: Store) -> None:
    with store.database.engine.begin() as conn:  # a node, and the election, as they stand
        conn.execute(
            text(
                "INSERT INTO nodes (name, epoch, lease_expires, last_seen, state)"
                " VALUES ('n1', 1, 1e12, 0, 'up')"
            )
        )
        conn.execute(
            text(
                "INSERT INTO leases (role, holder, epoch, expires)"
                " VALUES ('scheduler', 'n1', 1, 1e12)"
            )
        )


def _place(store: Store, job_id: int) -> list[int]:
    return store.placements.place([NodePlacement(job_id, "n1", ("GPU-1",), (0,))], "n1", 1)


def test_what_the_scheduler_placed_itself_is_not_read_again(
    store: Store, other: Store, queue_reads: Callable[[], int]
) -> None:
    """The elected scheduler's own placements are the queue's only change while a long
    queue drains onto free cards: it need not read every queued row for them. Anything
    else that changed the queue meanwhile, by it or another writer, is read."""
    _cluster_of_one(store)
    a, b, c = (store.jobs.add(new_job(), NOW).id for _ in range(3))
    assert _ids(store) == [a, b, c]
    reads = queue_reads()
    placed = _place(store, a)
    store.jobs.left_queue(placed)
    assert _ids(store) == [b, c]
    assert queue_reads() == reads
    # Another writer's submit between the read and the placement: read in full.
    late = other.jobs.add(new_job(), NOW).id
    store.jobs.left_queue(_place(store, b))
    assert _ids(store) == [c, late]
    assert queue_reads() == reads + 1
    # A change of its own besides the placement (a priority): read in full.
    assert store.jobs.set_priority(c, 3)
    store.jobs.left_queue(_place(store, late))
    assert [(j.id, j.priority) for j in store.jobs.queued()] == [(c, 3)]
    assert queue_reads() == reads + 2
    # A job it placed that it had not read (submitted after its read): read in full.
    new = other.jobs.add(new_job(), NOW).id
    store.jobs.left_queue(_place(store, new))
    assert _ids(store) == [c]
    assert queue_reads() == reads + 3


def test_the_counters_of_many_server_processes_are_folded_into_one(
    database_url: str, store: Store, queue_reads: Callable[[], int]
) -> None:
    """PostgreSQL keeps a counter per server process that changed the queue: past
    FOLD_ROWS of them a read folds them into one, the marker's value unchanged, so the
    marker stays one short read and no reader sees a change that did not happen."""
    if not database_url.startswith("postgresql"):
        pytest.skip("SQLite keeps one counter")
    job = store.jobs.add(new_job(), NOW).id
    with store.database.engine.begin() as conn:  # the rows of processes long gone
        conn.execute(
            text("INSERT INTO queue_marks (slot, n) SELECT -g, 1 FROM generate_series(1, :k) g"),
            {"k": queue_marks.FOLD_ROWS + 5},
        )
    assert _ids(store) == [job]  # the marker moved: read in full, then folded
    with store.database.engine.connect() as conn:
        value, rows = queue_marks.mark(conn)
    assert rows <= 3  # slot 0, and this test's own server processes
    reads = queue_reads()
    assert _ids(store) == [job]  # folding changed nothing: not read again
    assert queue_reads() == reads
    assert other_sees(database_url, value)
    assert store.jobs.set_priority(job, 4)  # and a change after it still moves it
    assert [j.priority for j in store.jobs.queued()] == [4]


def other_sees(database_url: str, value: int | None) -> bool:
    """Whether another store reads the same marker value."""
    second = Store(database_url)
    try:
        with second.database.engine.connect() as conn:
            return queue_marks.mark(conn)[0] == value
    finally:
        second.close()
