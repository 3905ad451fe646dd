"""Every table of the store, in one place: the head revision's columns, which the Alembic
revisions in gpusched/store/migrations build (tests/test_schema.py checks that they
match). A change of schema is a new revision there and its change here.

- `jobs`: one row per job, its latest run (store.jobs writes and reads it; store.usage,
  store.placements and store.attempts write their columns of it)
- `envs`: the submitters' environments, stored once each (gpusched.store.submits)
- `timeline_points`: each job's memory and utilization over time (store.timeline)
- `nodes`, `leases`: the cluster's nodes and the scheduler's election (store.nodes)
- `head_claims`: the cards kept for the blocked head job (store.head_claims)
- `job_attempts`: the earlier runs of requeued jobs (store.attempts)
- `queue_marks`: counters bumped by triggers on `jobs` whenever the queue as a pass reads
  it changes (gpusched.store.queue_marks; the triggers are revision 0017's)
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)

metadata = MetaData()

jobs = Table(
    "jobs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String, nullable=True),
    Column("user", String, nullable=False),
    Column("uid", Integer, nullable=False),
    Column("gid", Integer, nullable=False),
    Column("state", String, nullable=False, index=True),
    Column("command", JSON, nullable=False),
    Column("cwd", Text, nullable=False),
    Column("env", JSON, nullable=False),
    Column("umask", Integer, nullable=False),
    Column("mem", BigInteger, nullable=True),  # bytes: past 2**31 (PostgreSQL's INTEGER)
    Column("gpus", Integer, nullable=False),
    # `--ram` (host memory, bytes) and `--cpus` (cores); NULL: its GPUs' share of the
    # server's (revision 0021).
    Column("ram", BigInteger, nullable=True),
    Column("cpus", Integer, nullable=True),
    Column("gpu_indices", JSON, nullable=False, default=list),
    Column("gpu_uuids", JSON, nullable=False, default=list),
    Column("priority", Integer, nullable=False, default=0),
    Column("after", JSON, nullable=False, default=list),
    # How each of `after`'s jobs must end, in its order (core.after);
    # NULL: every one must succeed (revision 0018).
    Column("after_when", JSON, nullable=True),
    Column("submitted_at", String, nullable=False),
    Column("started_at", String, nullable=True),
    Column("ended_at", String, nullable=True, index=True),
    # Seconds it ran, on its supervisor's monotonic clock (revision 0019).
    Column("run_s", Float, nullable=True),
    # What it used of the host: its memory cgroup's peak (bytes) and its processes' CPU
    # time (seconds), from its exit record (revision 0022).
    Column("host_peak", BigInteger, nullable=True),
    Column("cpu_s", Float, nullable=True),
    Column("pid", Integer, nullable=True),
    Column("pid_start_time", String, nullable=True),  # guards against pid reuse
    Column("exit_code", Integer, nullable=True),
    Column("reason", String, nullable=True),
    Column("reason_detail", Text, nullable=True),
    Column("stop_intent", String, nullable=True),  # a StopIntent, while a running job stops
    Column("log_path", Text, nullable=True),
    Column("log_removed", Text, nullable=True),  # why its log went early (revision 0020)
    Column("peak_mem", BigInteger, nullable=True),
    Column("mean_util", Integer, nullable=True),
    Column("hints", JSON, nullable=False, default=list),
    Column("util_min", Integer, nullable=True),
    Column("util_max", Integer, nullable=True),
    Column("util_stddev", Float, nullable=True),
    Column("overrun_at", String, nullable=True),
    Column("retry_oom", Integer, nullable=True),  # OOM retries left
    Column("retry_of", Integer, nullable=True),  # an OOM retry: the first attempt's id
    Column("retried_as", Integer, nullable=True),
    Column("usage_state", JSON, nullable=True),  # the daemon's UsageTracker, between restarts
    Column("array_id", Integer, nullable=True, index=True),  # jobs of one --sweep share it
    Column("array_index", Integer, nullable=True),
    Column("max_concurrent", Integer, nullable=True),  # per array
    Column("time_limit_s", Float, nullable=True),
    Column("notify", JSON, nullable=True),  # argv run as the owner when the job ends
    # How that hook ended: {"kind", "exit_code", "output" (its last words)}; NULL until then.
    Column("notify_result", JSON, nullable=True),
    # `submit --output PATH`: where the job's log goes (a template: {id}, {array},
    # {index}), opened by the job's owner; NULL: log_dir/ID.log (gpusched.processes.output).
    Column("output", Text, nullable=True),
    # 1 from a job's end until its notification hooks start: they survive a restart.
    Column("hooks_due", Integer, nullable=True),
    # The job's environment in `envs` (then `env` is {}); NULL for rows written before.
    Column("env_id", Integer, nullable=True),
    # The cluster (store.nodes): the node it is placed on, that node's epoch when it was
    # placed (a write from an older epoch is refused), where it may go, and whether a
    # dead node's job goes back to the queue.
    Column("node", String, nullable=True, index=True),
    Column("node_epoch", Integer, nullable=True),
    Column("allowed_nodes", JSON, nullable=True),
    Column("requeue", Integer, nullable=True),
    # Why a queued job waits, as the cluster's scheduler last said (others read it here).
    Column("waiting_reason", Text, nullable=True),
    # 1: `gpusched run` / claim(); its pid and pid_start_time are its client's, from the
    # socket's peer credentials at the request, set while it waits too. Indexed: each
    # pass reads the active ones, few among 10,000 queued (revision 0017).
    Column("interactive", Integer, nullable=True, index=True),
    # Placement (policy rule 3 and the order): 1: --exclusive (a card to itself); 1:
    # --share (light, whatever it measures); `gpusched top`'s rank (lower first).
    Column("exclusive", Integer, nullable=True),
    Column("share", Integer, nullable=True),
    Column("top", Integer, nullable=True),
    # Measured (gpusched.usage.demand): its share of a card's busy time (0.0-1.0), the busy
    # jobs it took turns with on a saturated card, and its speed then against alone.
    Column("demand", Float, nullable=True),
    Column("shared_with", JSON, nullable=True),
    Column("sharing_speed", Float, nullable=True),
    # The client's id of the submit that made it: a submit retried after its
    # answer was lost finds this job instead of making a second. NULL: none was sent.
    Column("request_id", String, nullable=True, index=True, unique=True),
)

# Environments, stored once each and shared by every job submitted with the same one:
# a 10,000-job sweep stores its submitter's environment once, not 10,000 times, and a
# user's successive submits from one shell share a row. Keyed by a digest of the content.
envs = Table(
    "envs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("digest", String, nullable=False, unique=True),
    Column("env", JSON, nullable=False),
)

# Each job's memory and utilization over time, downsampled by the daemon as the job runs
# (gpusched.usage.timeline: at most about 1,000 points a job). `t`: epoch seconds of the
# point's first poll; `samples`: how many polls it stands for. Deleted with the job's row.
# WITHOUT ROWID on SQLite: the rows live in the primary key's b-tree, no second index.
timeline_points = Table(
    "timeline_points",
    metadata,
    Column("job_id", Integer, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("t", Float, primary_key=True),
    Column("memory", BigInteger, nullable=True),  # bytes, over all the job's GPUs
    Column("util", Float, nullable=True),  # 0-100
    Column("samples", Integer, nullable=False),
    sqlite_with_rowid=False,
)

nodes = Table(
    "nodes",
    metadata,
    Column("name", String, primary_key=True),
    Column("epoch", Integer, nullable=False),  # bumped when the node is declared down
    Column("lease_expires", Float, nullable=False),  # database clock, seconds since 1970
    Column("last_seen", Float, nullable=False),  # database clock
    Column("state", String, nullable=False),  # up, down or drained
    Column("drain_reason", Text, nullable=True),
    Column("owner", String, nullable=True),  # host:pid of the daemon holding the name
    Column("report", Text, nullable=True),  # JSON: its GPUs, usage, users it lacks
)

leases = Table(
    "leases",
    metadata,
    Column("role", String, primary_key=True),  # "scheduler"
    Column("holder", String, nullable=False),
    Column("epoch", Integer, nullable=False),  # bumped at each change of holder
    Column("expires", Float, nullable=False),  # database clock
)

# The head's claim between passes (store.head_claims): one row at most.
head_claims = Table(
    "head_claims",
    metadata,
    Column("job_id", Integer, primary_key=True),
    Column("gpu_uuids", JSON, nullable=False),
    Column("mem", BigInteger, nullable=True),  # the head's --mem per GPU; NULL: a whole GPU
)

# The earlier runs of requeued jobs (store.attempts): one row per run put back in the queue.
job_attempts = Table(
    "job_attempts",
    metadata,
    Column("job_id", Integer, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("attempt", Integer, primary_key=True),  # 1 for the first run
    Column("node", String, nullable=True),
    Column("started_at", String, nullable=True),
    Column("ended_at", String, nullable=True),  # when it was put back in the queue
    Column("outcome", Text, nullable=False),  # what ended it, in words
    # The cards the run held (NULL before 0016): a run taken back runs on them again.
    Column("gpu_uuids", JSON, nullable=True),
    Column("gpu_indices", JSON, nullable=True),
)

# The queue's change marker (gpusched.store.queue_marks): triggers on `jobs` (revision
# 0017) bump a row's `n` in every transaction that changes a queued row as a pass reads it;
# the rows are never deleted, so the sum of `n` moves at each such commit. `slot`: the
# PostgreSQL backend's pid (each writer its own row, no lock shared); 0 on SQLite.
queue_marks = Table(
    "queue_marks",
    metadata,
    Column("slot", Integer, primary_key=True, autoincrement=False),
    Column("n", BigInteger, nullable=False),
)
