"""Entry point for `python -m gpusched`."""

from gpusched.cli import main

main()
