"""Where Phoenix runs from: its own virtual environment, never the user's.

``anabranch ui`` uses, in this order: the Python of a ``phoenix`` command on PATH (its
script's interpreter), or the environment it created under the data directory
(``<data home>/phoenix-env``, or ``$ANABRANCH_PHOENIX_ENV``), creating it on first use
(``python -m venv`` and ``pip install``, a few minutes once). Phoenix's own dependency
pins (it constrains ``anthropic``, and pulls in ~150 packages) therefore never touch the
environment anabranch runs in.

Phoenix is started through a small launcher (``LAUNCHER``) that binds its OTLP/gRPC
collector to 127.0.0.1: Phoenix itself binds it on every interface.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "LAUNCHER",
    "PHOENIX_REQUIREMENT",
    "PhoenixInstallError",
    "find_phoenix_python",
    "install_phoenix",
    "serve_command",
]

PHOENIX_REQUIREMENT = "arize-phoenix>=20.26,<21"
"""What ``anabranch ui`` installs into its own environment (the current Phoenix)."""
MARKER = "anabranch-phoenix.txt"
"""Written into the environment once the install succeeded (holds the requirement)."""

LAUNCHER = """
import runpy, sys
try:
    import grpc.aio._server as _aio_server

    _original = _aio_server.Server.add_insecure_port

    def _loopback(self, address):
        port = address.rsplit(":", 1)[-1]
        return _original(self, "127.0.0.1:" + port)

    _aio_server.Server.add_insecure_port = _loopback
    _secure = _aio_server.Server.add_secure_port
    _aio_server.Server.add_secure_port = lambda self, address, credentials: _secure(
        self, "127.0.0.1:" + address.rsplit(":", 1)[-1], credentials
    )
except Exception as exc:  # an unknown grpc layout: refuse rather than listen everywhere
    sys.exit(f"anabranch: cannot bind Phoenix's gRPC collector to 127.0.0.1: {exc!r}")
sys.argv = ["phoenix", "serve"]
runpy.run_module("phoenix.server.main", run_name="__main__")
"""


class PhoenixInstallError(RuntimeError):
    """Creating Phoenix's environment failed (the message says why and how to retry)."""


def _env_python(env: Path) -> Path:
    return env / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")


def _script_python(script: str) -> Path | None:
    """The interpreter a console script runs with (its ``#!`` line, ``env`` resolved)."""
    try:
        with open(script, "rb") as handle:
            first = handle.readline(4096).decode("utf-8", "replace").strip()
    except OSError:
        return None
    parts = first[2:].split() if first.startswith("#!") else []
    if parts and Path(parts[0]).name == "env" and len(parts) > 1:
        found = shutil.which(parts[-1])
        return Path(found) if found else None
    return Path(parts[0]) if parts and Path(parts[0]).exists() else None


def find_phoenix_python(env: Path) -> Path | None:
    """The Python that runs Phoenix: a ``phoenix`` on PATH, else the environment ``env``
    (None: neither exists yet)."""
    on_path = shutil.which("phoenix")
    if on_path:
        python = _script_python(on_path)
        if python is not None:
            return python
    python = _env_python(env)
    if (env / MARKER).exists() and python.exists():
        return python
    return None


def install_phoenix(
    env: Path,
    *,
    requirement: str = PHOENIX_REQUIREMENT,
    log: Callable[[str], None] = print,
    timeout: float = 900.0,
) -> Path:
    """Create the environment ``env`` with Phoenix in it; returns its Python.

    Raises:
        PhoenixInstallError: venv or pip failed (pip's last lines in the message).
    """
    env.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if env.exists() and not (env / MARKER).exists():
        shutil.rmtree(env)  # a half-made environment from an interrupted install
    log(f"installing {requirement} into {env} (once; this takes a few minutes) ...")
    venv.EnvBuilder(with_pip=True, clear=False).create(env)
    python = _env_python(env)
    pip_env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    try:
        done = subprocess.run(
            [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", requirement],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=pip_env,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise PhoenixInstallError(f"installing Phoenix took over {timeout:.0f} s") from exc
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-4:])
        raise PhoenixInstallError(
            f"pip could not install {requirement} into {env}: {tail}; "
            "retry with: anabranch ui --install"
        )
    (env / MARKER).write_text(requirement + "\n", encoding="utf-8")
    log("Phoenix installed")
    return python


def serve_command(python: Path) -> list[str]:
    """The command that serves Phoenix from ``python``, gRPC on 127.0.0.1."""
    return [str(python), "-c", LAUNCHER]
