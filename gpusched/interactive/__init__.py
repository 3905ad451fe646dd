"""Interactive GPU work through the queue, the client's side: `gpusched run` (cli/run.py)
and `gpusched.claim()` for notebooks.

The calling process *is* the job: the daemon knows it by the socket's peer credentials,
holds its GPUs while it lives and ends the job when it reports its end or vanishes.
Modules: reservation.py (the requests: queue, wait for the placement, report the end),
foreground.py (the command in the caller's terminal), claim.py (`claim()` and the `Claim`
it returns), cuda.py (is CUDA already loaded here?).
Like the CLI, it imports only gpusched.core and the client: no SQLAlchemy, no pynvml.
"""
