"""A job's host memory and cores as this server gives them: the host rule's capacity
(gpusched.scheduling.policy.host) of what the launcher found (`HostFacts`) under the
`host:` config, the limits a job starts with (its `--ram` and `--cpus`, else its GPUs'
share, or its owner's `limits` `host_mem`), and a submit's checks of them: refused where
they could not be enforced (no writable cgroup) or could never fit.
"""

from __future__ import annotations

from dataclasses import replace

from gpusched.config.host import JOB_CPUS_ALL
from gpusched.config.settings import Config
from gpusched.core.errors import UsageError
from gpusched.core.models import Job
from gpusched.core.units import format_size
from gpusched.processes.launching import HostFacts
from gpusched.scheduling.policy.host import HostRoom, default_share, host_capacity, never_fits


def host_room(facts: HostFacts, config: Config) -> HostRoom:
    """This server's room for --ram and --cpus; None for what its jobs cannot be held to."""
    host = config.host
    capacity = host_capacity(
        facts.total_bytes,
        facts.service_bytes,
        len(facts.cores),
        reserve_fraction=host.ram_reserve_fraction,
        reserve_bytes=host.ram_reserve_bytes,
        reserve_min_bytes=host.ram_reserve_min_bytes,
        cpu_reserve=0,  # the launcher's cores are the ones left after it
    )
    return HostRoom(
        None if facts.no_memory else capacity.ram_bytes,
        None if facts.no_cpuset else capacity.cpus,
    )


def job_limits(job: Job, facts: HostFacts, config: Config) -> Job:
    """`job` as its supervisor is handed it: `ram` its memory limit (its --ram, else its
    owner's `host_mem`, else its GPUs' share of the capacity), `cpus` the size of its
    cpuset (its --cpus, else its GPUs' share of the cores; None: no cpuset)."""
    room, host = host_room(facts, config), config.host
    ram, cpus = job.ram, job.cpus
    if ram is None and room.ram_bytes is not None:
        own = config.limits_for(job.user).host_mem_bytes
        ram = (
            min(own, room.ram_bytes)
            if own is not None
            else default_share(room.ram_bytes, facts.gpu_count, job.gpus, host.job_ram_bytes)
        )
    if cpus is None and room.cpus is not None and host.job_cpus != JOB_CPUS_ALL:
        cpus = default_share(room.cpus, facts.gpu_count, job.gpus, host.job_cpus)
    return replace(job, ram=ram, cpus=cpus)


def check_host_ask(
    user: str, ram: int | None, cpus: int | None, facts: HostFacts, config: Config
) -> None:
    """A submit's `--ram` and `--cpus` refused (one line) where this server could not hold
    the job to them, or could never give them; else nothing."""
    if ram is not None and facts.no_memory is not None:
        raise UsageError(f"--ram cannot be enforced here ({facts.no_memory}): submit without it")
    if cpus is not None and facts.no_cpuset is not None:
        raise UsageError(f"--cpus cannot be enforced here ({facts.no_cpuset}): submit without it")
    own = config.limits_for(user).host_mem_bytes
    if ram is not None and own is not None and ram > own:
        raise UsageError(
            f"--ram {format_size(ram, tabular=False)} is more than {user}'s host_mem limit"
            f" ({format_size(own, tabular=False)})"
        )
    why = never_fits(ram, cpus, host_room(facts, config), "this server")
    if why is not None:
        raise UsageError(why)
