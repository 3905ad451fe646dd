"""A private PostgreSQL server for the tests: Debian's `postgresql` binaries, Unix socket only.

`PostgresServer.start()` runs `initdb` into a fresh temporary directory owned by the
`postgres` user (run as root, initdb and the server run as `postgres` through runuser;
as anyone else, as that user), and starts the server listening on no TCP address
(listen_addresses='') with its socket in that directory, named after a free port number so
that several test sessions on one machine never meet. `stop()` always ends it with pg_ctl.

Each test gets its own database, copied from a template already at the store's schema
(`CREATE DATABASE ... TEMPLATE`: a file copy, far cheaper than running the migrations).
Nothing is skipped: without PostgreSQL's binaries the fixture fails, saying what to install
(.ci/run installs the package).
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg import sql

SERVER_USER = "postgres"
TEMPLATE = "gpusched_template"


def server_binaries() -> Path:
    """The newest installed PostgreSQL's bin directory (Debian: /usr/lib/postgresql/N/bin)."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parent.parent.name),
    )
    if not found:
        raise RuntimeError(
            "PostgreSQL's server binaries are missing (/usr/lib/postgresql/*/bin/initdb):"
            " apt-get install postgresql"
        )
    return Path(found[-1]).parent


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    def __init__(self, *, fsync: bool = False) -> None:
        self.bin = server_binaries()
        # In /tmp whatever TMPDIR says: the `postgres` user must reach it, and the socket's
        # path must stay within the 107 bytes a Unix socket address holds.
        self.root = Path(tempfile.mkdtemp(prefix="gpusched-pg-", dir="/tmp"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.fsync = fsync  # off for the tests (a crash of the test server loses nothing)
        self._as_server_user: list[str] = []
        if os.geteuid() == 0:
            account = pwd.getpwnam(SERVER_USER)
            os.chown(self.root, account.pw_uid, account.pw_gid)
            self._as_server_user = ["runuser", "-u", SERVER_USER, "--"]
        self.superuser = SERVER_USER if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
        self._names = itertools.count(1)
        self.running = False

    # -- the server ---------------------------------------------------------------------------

    def _run(self, *argv: str) -> None:
        done = subprocess.run(
            [*self._as_server_user, *argv],
            capture_output=True,
            text=True,
            cwd=self.root,
            check=False,
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{Path(argv[0]).name} failed: {done.stderr.strip()[-2000:]}")

    def init(self) -> None:
        self._run(
            str(self.bin / "initdb"),
            "-D",
            str(self.data),
            "-U",
            self.superuser,
            "-A",
            "trust",  # Unix socket in a private directory: only this machine's root reaches it
            "-E",
            "UTF8",
            "--no-sync",
        )

    def start(self) -> None:
        options = f"-c listen_addresses='' -k {self.root} -p {self.port}"
        if not self.fsync:
            options += " -c fsync=off -c full_page_writes=off"
        self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.root / "server.log"),
            "-o",
            options,
            "-w",
            "start",
        )
        self.running = True

    def stop(self, mode: str = "fast") -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")
        self.running = False

    def close(self) -> None:
        """Stop the server (if it runs) and delete its files: always, at the session's end."""
        try:
            if self.running:
                self.stop("immediate")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    # -- databases ----------------------------------------------------------------------------

    def url(self, database: str, driver: str = "postgresql+psycopg") -> str:
        return f"{driver}://{self.superuser}@/{database}?host={self.root}&port={self.port}"

    def admin(self) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(
            host=str(self.root),
            port=self.port,
            user=self.superuser,
            dbname="postgres",
            autocommit=True,
        )

    def create_database(self, template: str = "template0") -> str:
        name = f"test_{next(self._names)}"
        with self.admin() as conn:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(template)
                )
            )
        return name

    def drop_database(self, name: str) -> None:
        with self.admin() as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    def make_template(self) -> None:
        """The store's schema, once, in TEMPLATE (copied by each test's database)."""
        from gpusched.store import Store

        with self.admin() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(TEMPLATE)))
        Store(self.url(TEMPLATE)).close()
        with self.admin() as conn:  # no one may stay connected to a template being copied
            conn.execute(
                sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS false").format(
                    sql.Identifier(TEMPLATE)
                )
            )


@contextlib.contextmanager
def private_server(*, fsync: bool = False) -> Iterator[PostgresServer]:
    server = PostgresServer(fsync=fsync)
    try:
        server.init()
        server.start()
        server.make_template()
        yield server
    finally:
        server.close()
