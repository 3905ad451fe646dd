#!/bin/sh
# Install (or upgrade) gpusched from this checkout into its own Python environment, and
# put the `gpusched` command on every user's PATH. docs/operations.md ("Install") shows and
# explains these steps; tests/test_install.py runs this script, so the two cannot drift.
#
#   sudo scripts/install.sh [--prefix /opt/gpusched] [--bindir /usr/local/bin] [--python /usr/bin/python3]
#
# Why a venv: Debian 12 and Ubuntu 23.04+ mark their Python "externally managed" (PEP 668)
# and refuse `sudo pip install .`; a venv is also kept apart from the distribution's own
# Python packages, so an apt upgrade cannot break the daemon and the daemon cannot break apt.
# Running it again upgrades in place: the same venv, the package reinstalled from the
# checkout; then `sudo systemctl restart gpusched` (running jobs keep running).
set -eu

prefix=/opt/gpusched
bindir=/usr/local/bin
python=/usr/bin/python3
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) prefix=$2; shift 2 ;;
        --bindir) bindir=$2; shift 2 ;;
        --python) python=$2; shift 2 ;;
        *) echo "usage: $0 [--prefix DIR] [--bindir DIR] [--python PYTHON]" >&2; exit 2 ;;
    esac
done
checkout=$(cd "$(dirname "$0")/.." && pwd)

# Every user runs the installed `gpusched` (the CLI) from this venv. An administrator whose
# umask is 077 would otherwise create a venv that only root can read, and every user's
# `gpusched status` would fail with "Permission denied".
umask 022

if ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
    echo "$python cannot create a venv: install it first (Debian, Ubuntu: sudo apt install python3-venv)" >&2
    exit 1
fi

# Built from a copy: a build in the checkout leaves root-owned gpusched.egg-info and build/
# there, which stop an ordinary user's later pip from building it ("Permission denied").
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
mkdir "$build/src" "$build/wheels"
tar -C "$checkout" --exclude=.git --exclude=.venv --exclude='*.egg-info' --exclude=build \
    --exclude=dist --exclude=__pycache__ -cf - . | tar -C "$build/src" -xf -

# Already installed here: this run is an upgrade, whose next step differs.
upgrade=false
[ -x "$prefix/bin/gpusched" ] && upgrade=true

set -x
"$python" -m venv "$prefix"
# One wheel of the pure-Python package, plus wheels of the client's own dependencies (click,
# PyYAML), so that users install the client with no root and no package index (the name
# gpusched on PyPI is another project's).
"$prefix/bin/pip" wheel --quiet --wheel-dir "$build/wheels" "$build/src"
# Not editable (-e): the service must not run code from a checkout someone may edit or remove.
# [daemon]: the daemon's dependencies; the second step replaces the code even when the
# version number is the one already installed (a `git pull` between releases).
"$prefix/bin/pip" install --quiet --upgrade "$(echo "$build"/wheels/gpusched-*.whl)[daemon]"
"$prefix/bin/pip" install --quiet --force-reinstall --no-deps "$build"/wheels/gpusched-*.whl
# Replaced whole: an old version's wheel beside the new would make the documented
# `pip install .../gpusched-*.whl` name two.
rm -rf "$prefix/share/wheels"
install -d -m 0755 "$prefix/share/wheels"
install -m 0644 "$build"/wheels/*.whl "$prefix/share/wheels/"
install -d -m 0755 "$bindir"
ln -sfn "$prefix/bin/gpusched" "$bindir/gpusched"
install -d -m 0755 "$prefix/share/doc/gpusched"
install -m 0644 "$checkout/README.md" "$checkout"/docs/*.md "$prefix/share/doc/gpusched/"

# What to do next, as docs/operations.md ("Install", "Upgrade without killing jobs") says.
{ set +x; } 2>/dev/null
command=gpusched
[ "$bindir" = /usr/local/bin ] || command="$bindir/gpusched"
echo
if $upgrade; then
    echo "gpusched upgraded in $prefix. Next: the daemon runs the new code once restarted"
    echo "(running jobs keep running):"
    echo "  sudo systemctl restart gpusched"
else
    echo "gpusched installed in $prefix, the command in $bindir. Next: its config and its"
    echo "service (docs/operations.md, \"Install\"):"
    echo "  sudo install -D -m 0644 $checkout/config/gpusched.yaml /etc/gpusched/config.yaml"
    echo "  sudo install -m 0644 $checkout/systemd/gpusched.service /etc/systemd/system/gpusched.service"
    if [ "$prefix" != /opt/gpusched ]; then
        echo "  sudo systemctl edit gpusched   # ExecStart= and ExecReload= at $prefix/bin/gpusched: docs/operations.md"
    fi
    echo "  sudo systemctl daemon-reload"
    echo "  sudo systemctl enable --now gpusched"
fi
echo "  sudo $command doctor"
