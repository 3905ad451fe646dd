"""The module path that the job supervisor had before gpusched's layer packages: a shim.

A daemon of the previous version that is still running after the package was upgraded
under it starts `python -m gpusched.supervisor ...`; this keeps that command working until the
daemon is restarted. New daemons start `python -m gpusched.processes.supervisor`.

May be dropped in 0.3.0, once no daemon of 0.1.x from before the layer packages can still
be running: any daemon restarted since starts only the new path.
"""

import sys

from gpusched.processes.supervisor import main  # relayout: keep

if __name__ == "__main__":
    sys.exit(main(sys.argv))
