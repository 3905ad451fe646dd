"""Scheduling: one pass, `Scheduler.tick()`, as named phases (phases) on a context built
once (context); the shared pass rules (pass_rules: admission, the interactive cap,
failed dependencies, user caps, fair share, the pure policy `plan()`) decided for one of
two placers, which acts on them (placers' `LocalPlacer`, or the cluster's `ClusterAgent`,
package cluster); how jobs end (endings) and start (starting), whose jobs are whose
(ownership), the administrator's drain, and status's GPU figures. Reaches processes only through
`processes.launching.JobLauncher`, hardware only through `gpus.probe.Probe`, jobs only
through the Store. docs/architecture.md draws it.
"""
