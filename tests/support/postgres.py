"""A throwaway PostgreSQL 15 cluster for the store's tests: Debian's binaries, a temporary directory, a free
port of 127.0.0.1, the unix socket in the data directory, stopped (`pg_ctl stop -m fast`) and removed when
closed.

The cluster runs as the `postgres` user when we are root (PostgreSQL refuses to run as root), else as us.
Clients authenticate as the role `servelab` with a password (scram-sha-256, 127.0.0.1 only) that comes to
them in PGPASSWORD, never in a URL: a test can then prove the password is never printed. Each test gets
its own database (`fresh_db`), dropped after it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

BIN = Path("/usr/lib/postgresql/15/bin")
HOST = "127.0.0.1"
ROLE = "servelab"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class PgCluster:
    datadir: Path
    port: int
    password: str
    run_as: list[str]  # the command prefix that runs a binary as the cluster's owner

    def url(self, dbname: str) -> str:
        """A URL with no password in it (the password is in `env()`)."""
        return f"postgresql://{ROLE}@{HOST}:{self.port}/{dbname}"

    def env(self) -> dict[str, str]:
        return {"PGPASSWORD": self.password, "PGCONNECT_TIMEOUT": "10"}

    def admin(self, sql: str) -> None:
        """Run SQL as the superuser over the unix socket (CREATE/DROP DATABASE)."""
        subprocess.run(
            [
                *self.run_as,
                str(BIN / "psql"),
                "-h",
                str(self.datadir),
                "-p",
                str(self.port),
                "-d",
                "postgres",
                "-v",
                "ON_ERROR_STOP=1",
                "-qAt",
                "-c",
                sql,
            ],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )

    @contextlib.contextmanager
    def fresh_db(self) -> Iterator[str]:
        """A new empty database owned by the servelab role; its URL; dropped after."""
        name = "t_" + uuid.uuid4().hex[:12]
        self.admin(f"CREATE DATABASE {name} OWNER {ROLE}")
        try:
            yield self.url(name)
        finally:
            self.admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@contextlib.contextmanager
def pg_cluster() -> Iterator[PgCluster]:
    """Start a cluster; stop it and remove its directory after."""
    if not (BIN / "initdb").exists():
        raise RuntimeError(f"{BIN / 'initdb'} is missing: scripts/test.sh installs postgresql-15")
    root = Path(tempfile.mkdtemp(prefix="servelab-pg-"))
    datadir = root / "data"
    run_as: list[str] = []
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        os.chown(root, owner.pw_uid, owner.pw_gid)
        run_as = ["runuser", "-u", "postgres", "--"]
    password = secrets.token_urlsafe(18)
    pwfile = root / "pw"
    pwfile.write_text(password + "\n")
    if run_as:
        owner = pwd.getpwnam("postgres")
        os.chown(pwfile, owner.pw_uid, owner.pw_gid)
    pwfile.chmod(0o600)
    port = _free_port()
    started = False
    try:
        subprocess.run(
            [
                *run_as,
                str(BIN / "initdb"),
                "-D",
                str(datadir),
                "-U",
                "postgres",
                "-A",
                "peer",
                "--auth-host=scram-sha-256",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ],
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        (datadir / "pg_hba.conf").write_text(
            "local all postgres peer\nhost all servelab 127.0.0.1/32 scram-sha-256\n"
        )
        opts = f"-p {port} -k {datadir} -c listen_addresses={HOST} -c fsync=off -c max_connections=60"
        subprocess.run(
            [
                *run_as,
                str(BIN / "pg_ctl"),
                "-D",
                str(datadir),
                "-o",
                opts,
                "-l",
                str(root / "log"),
                "-w",
                "-t",
                "60",
                "start",
            ],
            check=True,
            capture_output=True,
            text=True,
            timeout=90,
            stdin=subprocess.DEVNULL,
        )
        started = True
        cluster = PgCluster(datadir, port, password, run_as)
        cluster.admin(f"CREATE ROLE {ROLE} LOGIN CREATEDB PASSWORD '{password}'")
        yield cluster
    finally:
        if started:
            subprocess.run(
                [*run_as, str(BIN / "pg_ctl"), "-D", str(datadir), "-m", "fast", "-w", "stop"],
                capture_output=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
            )
        shutil.rmtree(root, ignore_errors=True)
