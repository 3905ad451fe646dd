"""The shared vocabulary of client and daemon: job and GPU models, the wire protocol,
errors, units (parse and format), config, clock, and the pure helpers both sides use
(sizing estimates, hints, sweeps). Imports no other gpusched package, and nothing heavy:
the CLI imports it at every start.
"""
