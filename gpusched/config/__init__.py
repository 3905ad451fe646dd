"""The daemon's configuration: the `Config` a YAML file parses into (settings), the
checks of each value (values, retention, interactive), where the files live by default
(paths), and the live holder a reload swaps (holder).

Below every daemon-side package and above core: the daemon, the scheduler, the store and
the processes read it; the client reads only a config file's socket (gpusched.daemon_socket).
Empty on purpose: finding the socket needs paths, not the whole parser.
"""
