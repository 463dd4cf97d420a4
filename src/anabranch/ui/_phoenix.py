"""Run Arize Phoenix locally and offline, and find the one ``anabranch ui`` started.

Phoenix runs from its own environment (``_phoenix_env``: created under the data dir on
first use, or a ``phoenix`` on PATH), never from the user's, with telemetry, external
resources, the agent assistant and server-side bash turned off, its HTTP server on
127.0.0.1 and its SQLite data under the user's data dir.
A small state file tells ``anabranch run --trace phoenix`` where it listens.

Its OTLP/gRPC collector is bound to 127.0.0.1 by the launcher (Phoenix itself binds it on
every interface); anabranch sends over OTLP/HTTP and picks a free gRPC port.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

from anabranch._process import pid_alive
from anabranch.errors import UserError
from anabranch.ui._phoenix_env import (
    PhoenixInstallError,
    find_phoenix_python,
    install_phoenix,
    serve_command,
)

__all__ = [
    "DEFAULT_PORT",
    "PhoenixError",
    "PhoenixInfo",
    "PhoenixServer",
    "clear_state",
    "data_home",
    "ensure_phoenix",
    "free_port",
    "phoenix_available",
    "phoenix_env",
    "phoenix_environment",
    "read_state",
    "running_phoenix",
    "state_path",
    "stop_recorded",
    "write_state",
]

DEFAULT_PORT = 6006
DEFAULT_GRPC_PORT = 4317
HOST = "127.0.0.1"
INSTALL_HINT = (
    "Arize Phoenix is not set up: `anabranch ui --install` creates its own environment "
    "(a few minutes, once), or put a `phoenix` command on PATH"
)


class PhoenixError(UserError):
    """Phoenix is missing, did not start, or is not running."""


@dataclass(frozen=True)
class PhoenixInfo:
    """Where a running Phoenix listens."""

    url: str
    """Base URL of the UI and REST API, e.g. ``http://127.0.0.1:6006``."""
    pid: int
    port: int
    grpc_port: int
    working_dir: str

    @property
    def otlp_endpoint(self) -> str:
        """The OTLP/HTTP (protobuf) traces endpoint."""
        return f"{self.url}/v1/traces"

    def trace_url(self, trace_id: str) -> str:
        """A link that opens one trace (by its hex OTel id) in the UI."""
        return f"{self.url}/redirects/traces/{trace_id}"


def data_home() -> Path:
    """The user's data directory for anabranch (``$XDG_DATA_HOME/anabranch`` on Linux)."""
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "anabranch"


def state_path() -> Path:
    """The file ``anabranch ui`` writes while Phoenix runs."""
    return data_home() / "phoenix-server.json"


def phoenix_env() -> Path:
    """Where ``anabranch ui`` keeps Phoenix's own environment."""
    configured = os.environ.get("ANABRANCH_PHOENIX_ENV")
    return Path(configured) if configured else data_home() / "phoenix-env"


def phoenix_available() -> bool:
    """Whether a Phoenix can be started without installing one (ours, or one on PATH)."""
    return find_phoenix_python(phoenix_env()) is not None


def ensure_phoenix(*, install: bool, log: Callable[[str], None]) -> Path:
    """The Python that runs Phoenix, installing our environment first if allowed."""
    python = find_phoenix_python(phoenix_env())
    if python is not None:
        return python
    if not install:
        raise PhoenixError(INSTALL_HINT)
    try:
        return install_phoenix(phoenix_env(), log=log)
    except PhoenixInstallError as exc:
        raise PhoenixError(str(exc)) from exc


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port(preferred: int | None = None, *, avoid: tuple[int, ...] = ()) -> int:
    """``preferred`` if it is free on 127.0.0.1, else a free port chosen by the OS."""
    if preferred and preferred not in avoid and _port_free(preferred):
        return preferred
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, 0))
            port = int(sock.getsockname()[1])
        if port not in avoid:
            return port


def phoenix_environment(working_dir: Path, port: int, grpc_port: int) -> dict[str, str]:
    """Environment variables for an offline, local-only Phoenix."""
    return {
        "PHOENIX_WORKING_DIR": str(working_dir),
        "PHOENIX_HOST": HOST,
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(grpc_port),
        "PHOENIX_TELEMETRY_ENABLED": "false",
        "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",
        "PHOENIX_DISABLE_AGENT_ASSISTANT": "true",
        "PHOENIX_AGENTS_DISABLE_BASH": "true",
    }


def healthy(url: str, timeout: float = 1.0) -> bool:
    """Whether ``{url}/healthz`` answers 200."""
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=timeout) as response:
            return int(response.status) == 200
    except (OSError, urllib.error.URLError, ValueError):
        return False


def _is_phoenix(info: PhoenixInfo) -> bool:
    """Whether ``info.pid`` is still that Phoenix (guards against a reused pid)."""
    if not pid_alive(info.pid):
        return False
    cmdline = Path(f"/proc/{info.pid}/cmdline")
    if cmdline.exists():
        try:
            return b"phoenix" in cmdline.read_bytes()
        except OSError:
            return False
    return healthy(info.url)


def _mkdir_private(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)


class PhoenixServer:
    """A Phoenix process started by us. ``start`` launches it; ``wait_ready``; ``stop``."""

    def __init__(self, process: subprocess.Popen[bytes], info: PhoenixInfo, log: Path) -> None:
        self.process = process
        self.info = info
        self.log_path = log

    @classmethod
    def start(
        cls,
        working_dir: str | os.PathLike[str] | None = None,
        *,
        port: int | None = None,
        grpc_port: int | None = None,
        detach: bool = False,
        extra_env: Mapping[str, str] | None = None,
        install: bool = False,
        on_progress: Callable[[str], None] = print,
    ) -> PhoenixServer:
        """Launch Phoenix (not yet ready: call ``wait_ready``).

        Args:
            working_dir: where Phoenix keeps its database; default ``<data home>/phoenix``.
            port: HTTP port (UI, REST, OTLP/HTTP); default 6006 if free, else any free port.
            grpc_port: OTLP/gRPC port; default 4317 if free, else any free port.
            detach: start it in its own session so it outlives this process.
            install: create Phoenix's own environment first if there is none.
        """
        python = ensure_phoenix(install=install, log=on_progress)
        work = Path(working_dir) if working_dir is not None else data_home() / "phoenix"
        _mkdir_private(work)
        http_port = port if port is not None else free_port(DEFAULT_PORT)
        rpc_port = (
            grpc_port if grpc_port is not None else free_port(DEFAULT_GRPC_PORT, avoid=(http_port,))
        )
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PHOENIX_", "OTEL_")) and k != "ANTHROPIC_API_KEY"
        }
        env.update(phoenix_environment(work, http_port, rpc_port))
        env.update(extra_env or {})
        log = work / "phoenix.log"
        log_file: IO[bytes] = open(log, "ab")
        try:
            process = subprocess.Popen(
                serve_command(python),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=detach,
            )
        finally:
            log_file.close()
        info = PhoenixInfo(
            url=f"http://{HOST}:{http_port}",
            pid=process.pid,
            port=http_port,
            grpc_port=rpc_port,
            working_dir=str(work),
        )
        return cls(process, info, log)

    def wait_ready(self, timeout: float = 120.0) -> PhoenixInfo:
        """Poll ``/healthz`` until it answers (Phoenix takes 10-20 s to start)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise PhoenixError(
                    f"Phoenix exited with code {self.process.returncode} while starting; "
                    f"last log lines: {self.log_tail()}"
                )
            if healthy(self.info.url):
                return self.info
            time.sleep(0.25)
        self.stop()
        raise PhoenixError(
            f"Phoenix did not answer on {self.info.url} within {timeout:.0f} s; "
            f"last log lines: {self.log_tail()}"
        )

    def log_tail(self, lines: int = 8) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(line.strip() for line in text.splitlines()[-lines:] if line.strip())

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate the process (SIGTERM, then SIGKILL after ``timeout``)."""
        if self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout)


# ---------------------------------------------------------------------- state file
def write_state(info: PhoenixInfo, path: Path | None = None) -> Path:
    """Record where Phoenix listens (owner-only file)."""
    target = path or state_path()
    _mkdir_private(target.parent)
    tmp = target.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(asdict(info), handle)
    tmp.replace(target)
    return target


def read_state(path: Path | None = None) -> PhoenixInfo | None:
    """The recorded Phoenix, or None if there is no (readable) state file."""
    try:
        data = json.loads((path or state_path()).read_text(encoding="utf-8"))
        return PhoenixInfo(
            url=str(data["url"]),
            pid=int(data["pid"]),
            port=int(data["port"]),
            grpc_port=int(data["grpc_port"]),
            working_dir=str(data["working_dir"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def clear_state(pid: int | None = None, path: Path | None = None) -> None:
    """Remove the state file (only if it belongs to ``pid``, when given)."""
    target = path or state_path()
    if pid is not None:
        current = read_state(target)
        if current is not None and current.pid != pid:
            return
    with contextlib.suppress(FileNotFoundError):
        target.unlink()


def running_phoenix(path: Path | None = None) -> PhoenixInfo | None:
    """The Phoenix ``anabranch ui`` started, if its process is alive (a stale file is removed)."""
    info = read_state(path)
    if info is None:
        return None
    if not _is_phoenix(info):
        clear_state(info.pid, path)
        return None
    return info


def stop_recorded(path: Path | None = None, timeout: float = 10.0) -> PhoenixInfo | None:
    """Stop the Phoenix recorded in the state file; returns it, or None if none ran."""
    info = running_phoenix(path)
    if info is None:
        return None
    with contextlib.suppress(ProcessLookupError):
        os.kill(info.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pid_alive(info.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(info.pid, os.WNOHANG)
    clear_state(info.pid, path)
    return info
