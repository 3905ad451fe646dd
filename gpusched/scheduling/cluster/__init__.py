"""The cluster: several daemons, one queue in one database, one of them elected to place.

agent (`ClusterAgent`, this daemon's placer: renew the node's lease, stop what was
cancelled elsewhere, schedule if elected, start what was placed here), elected (the
elected scheduler: declare nodes down, the shared pass rules over every node, write the
placements), inputs (every node's report as the plan's inputs, pure), election (who
schedules and whether a node is fenced, pure), node (`ClusterNode`, the ownership
strategy, and the injected `Identity`).
"""
