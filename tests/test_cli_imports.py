"""What `gpusched status`, `show` and `submit` import (issue 30: the CLI at interpreter
speed). Each module a command imports costs every call its start-up, so the commands
people run most load only what they use: not every other command's module, not the
config parser and YAML when no config file is in play, not the other request classes,
not the interactive modules. Counted, never timed: the timing is benchmarks/cli_latency.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.daemon_harness import RunningDaemon

# Imported by `main()` and then listed: what one real command, start to end, loaded.
_RUN_AND_LIST = """
import json, sys
from gpusched.cli import main
sys.argv = ["gpusched", *sys.argv[1:]]
try:
    main()
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""

NOT_FOR_STATUS_OR_SHOW = {
    "yaml",
    "sqlalchemy",
    "apscheduler",
    "pynvml",
    "gpusched.config.settings",
    "gpusched.core.requests.catalog",
    "gpusched.submitter",
    "gpusched.core.requests.interactive",
    "gpusched.interactive.foreground",
    "gpusched.interactive.reservation",
    "gpusched.cli.jobs",
    "gpusched.cli.submit",
    "gpusched.cli.run",
    "gpusched.cli.admin",
}

# What building the models' or the requests' dataclasses would load.
NO_DATACLASSES = {
    "dataclasses",
    "typing",
    "gpusched.core.models",
    "gpusched.core.hints",
    "gpusched.core.requests.base",
    "gpusched.core.requests.views",
}
# Standard modules none of the three needs: shutil (its import loads zlib, bz2 and lzma;
# `which` and the terminal's width are read without it) and decimal (a whole size such as
# 1G is parsed without it).
NOT_NEEDED = {"shutil", "decimal", "_decimal", "bz2", "lzma"}


def _modules_of(daemon: RunningDaemon, *args: str) -> set[str]:
    env = {k: v for k, v in daemon.env.items() if k != "GPUSCHED_CONFIG"}
    env["GPUSCHED_SOCKET"] = str(daemon.socket_path)
    done = subprocess.run(
        [sys.executable, "-c", _RUN_AND_LIST, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    listed = json.loads(done.stderr.strip().splitlines()[-1])
    assert listed["code"] in (0, None), done.stderr
    return set(listed["modules"])


def test_status_show_and_submit_import_only_what_they_use(tmp_path: Path) -> None:
    daemon = RunningDaemon(tmp_path, simulate="1x24G").start()
    try:
        submitted = _modules_of(daemon, "submit", "--mem", "1G", "--hold", "--", "true")
        for args in (["status"], ["status", "--json"], ["show", "1"]):
            loaded = _modules_of(daemon, *args)
            # Answered by the fast path (cli/fast.py): neither click nor its commands.
            assert not loaded & {"click", "gpusched.cli.group", "gpusched.cli.views"}, args
            assert not loaded & NOT_FOR_STATUS_OR_SHOW, (args, loaded & NOT_FOR_STATUS_OR_SHOW)
            assert "gpusched.cli.estimate" not in loaded
            # Drawn from the reply's JSON: no models, no dataclass at all.
            assert not loaded & NO_DATACLASSES, (args, loaded & NO_DATACLASSES)
            assert not loaded & NOT_NEEDED, (args, loaded & NOT_NEEDED)
            assert f"gpusched.cli.{args[0]}_view" in loaded
            # The reply types are for type checking: no command imports them to run.
            assert "gpusched.core.requests.replies" not in loaded, args
    finally:
        daemon.stop()
    # A submit needs its own helpers and checks, still not the other commands' modules,
    # and its request is sent as a frame: not the 21 request classes, not the client.
    assert {
        "gpusched.cli.submit_view",
        "gpusched.core.requests.checks",
        "gpusched.submitter",
    } <= submitted
    assert not submitted & {
        "click",
        "yaml",
        "gpusched.config.settings",
        "gpusched.cli.submit",
        "gpusched.cli.run",
        "gpusched.cli.admin",
        "gpusched.core.requests.catalog",
        "gpusched.core.requests.base",
        "gpusched.client",
        *NO_DATACLASSES,
        *NOT_NEEDED,
    }, submitted & (NO_DATACLASSES | NOT_NEEDED)
