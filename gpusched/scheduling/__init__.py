"""Scheduling: `Scheduler.tick()` as observe -> admit -> plan -> start (scheduler,
observe, admission), the pure placement policy (policy, policy_inputs, fair_share), how
jobs end (endings), the administrator's drain, and status's GPU figures. Reaches
processes only through `processes.launching.JobLauncher`, hardware only through
`gpus.probe.Probe`, jobs only through the Store.
"""
