"""Processes: the launcher (zygote -> supervisor per job -> the job, as its owner), the
interface the scheduler sees (launching), a job's environment, process identity
(pidref: pid plus start time, once), the supervisor and the zygote. The module paths
`gpusched.supervisor` and `gpusched.zygote` stay importable as shims (upgrades in place).
"""
