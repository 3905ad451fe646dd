"""The read-only web dashboard (config `web: HOST:PORT`): the GPUs, the queue, each job's
memory and utilization over time, and each user's fair-share usage.

api.py: the JSON the pages poll, produced by the socket's own view handlers called as an
anonymous viewer; site.py: the routes (pages, static files, API) with their headers;
static/: the pages themselves (HTML, one hand-written script, one style sheet), served
from the package, with no build step and nothing fetched from elsewhere.
"""
