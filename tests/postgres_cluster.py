"""A private PostgreSQL cluster for the tests: initdb into a temporary folder, listening
on 127.0.0.1 on a free port, stopped at the end of the session.

``initdb`` refuses to run as root, so as root the server runs as the ``postgres`` user
(Debian's package creates it). Password authentication is on (scram), so DSNs in the tests
carry a real password and the redaction checks are meaningful.

Outside CI a machine without PostgreSQL skips the tests that need it, with the reason;
in CI (``CI=true``) that is a failure instead.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PASSWORD_BYTES = 12


@dataclass(frozen=True)
class Cluster:
    host: str
    port: int
    user: str
    password: str = field(repr=False)  # never in a failure report
    bindir: Path
    data: Path

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}:{self.password}@{self.host}:{self.port}/{database}"

    def psql(self, sql: str, database: str = "postgres") -> str:
        env = {**os.environ, "PGPASSWORD": self.password}
        done = subprocess.run(
            [
                str(self.bindir / "psql"),
                "-h",
                self.host,
                "-p",
                str(self.port),
                "-U",
                self.user,
                "-d",
                database,
                "-At",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return done.stdout


def _bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]))
    if found:
        return Path(found[-1])
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_server_user(argv: list[str]) -> list[str]:
    if os.getuid() != 0:
        return argv
    return ["runuser", "-u", "postgres", "--", *argv]


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"PostgreSQL is required in CI: {reason}")
    pytest.skip(f"no PostgreSQL server can be started here: {reason}")


@contextlib.contextmanager
def start_cluster(*, durable: bool = False) -> Iterator[Cluster]:
    """Start a throwaway cluster (or skip/fail when none can be started); stop it after.

    The tests kill processes, never the OS, so they run with ``fsync=off``; ``durable``
    (the benchmarks) keeps PostgreSQL's defaults."""
    bindir = _bindir()
    if bindir is None or not (bindir / "initdb").exists():
        _unavailable("initdb not found (apt-get install postgresql)")
        raise AssertionError("unreachable")
    if os.getuid() == 0:
        try:
            server_user = pwd.getpwnam("postgres")
        except KeyError:
            _unavailable("running as root and there is no 'postgres' user for initdb")
            raise AssertionError("unreachable") from None
    workdir = Path(tempfile.mkdtemp(prefix="anabranch-pg-"))
    data, sockets = workdir / "data", workdir / "sockets"
    sockets.mkdir()
    password = secrets.token_urlsafe(PASSWORD_BYTES)
    pwfile = workdir / "pw"
    pwfile.write_text(password + "\n")
    if os.getuid() == 0:
        for path in (workdir, sockets, pwfile):
            os.chown(path, server_user.pw_uid, server_user.pw_gid)
    port = _free_port()
    started = False
    try:
        subprocess.run(
            _as_server_user(
                [
                    str(bindir / "initdb"),
                    "-D",
                    str(data),
                    "-U",
                    "postgres",
                    "--no-sync",
                    "--auth-local=trust",
                    "--auth-host=scram-sha-256",
                    f"--pwfile={pwfile}",
                    "-E",
                    "UTF8",
                    "--locale=C",
                ]
            ),
            check=True,
            capture_output=True,
            timeout=120,
        )
        pwfile.unlink()
        options = (
            f"-c listen_addresses=127.0.0.1 -p {port} -k {sockets} "
            "-c max_connections=200 -c shared_buffers=64MB "
            # the conformance suite counts committed transactions where the server sees them
            "-c shared_preload_libraries=pg_stat_statements"
        )
        if not durable:
            options += " -c fsync=off -c full_page_writes=off"
        subprocess.run(
            _as_server_user(
                [
                    str(bindir / "pg_ctl"),
                    "-D",
                    str(data),
                    "-l",
                    str(workdir / "log"),
                    "-w",
                    "-t",
                    "60",
                    "-o",
                    options,
                    "start",
                ]
            ),
            check=True,
            capture_output=True,
            timeout=90,
        )
        started = True
        yield Cluster("127.0.0.1", port, "postgres", password, bindir, data)
    except subprocess.CalledProcessError as exc:
        _unavailable(f"{exc.cmd[0]} failed: {exc.stderr!r}")
    finally:
        if started:
            subprocess.run(
                _as_server_user(
                    [str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"]
                ),
                capture_output=True,
                timeout=60,
            )
        shutil.rmtree(workdir, ignore_errors=True)


def create_database(cluster: Cluster) -> str:
    """A fresh, empty database on the cluster; returns its DSN (with the password)."""
    import psycopg

    name = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(cluster.dsn(), autocommit=True, connect_timeout=10) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return cluster.dsn(name)
