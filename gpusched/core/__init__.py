"""The shared vocabulary of client and daemon, and nothing else: job and GPU models
(models), the wire contract (requests/: framing, one request type per operation, the
sweep grammar, typed replies), errors, units (parse and format), sanitize (what may reach
a terminal), clock, and hints (the advice both `estimate` and the daemon's `show` and
usage monitor give). Imports no other gpusched package and no file, process, thread, log
or YAML machinery (the import-linter contracts in pyproject.toml): the CLI imports it at
every start. The config file's parser is gpusched.config; one-sided helpers live with
their side.
"""
