"""What running jobs use: per-job memory and utilization trackers (tracker), the monitor
that feeds them each tick and finds overruns (monitor), which GPU processes belong to
which job (attribution), and the notes gpusched writes into a job's log (joblog).
"""
