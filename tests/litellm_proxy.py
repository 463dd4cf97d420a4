"""A real LiteLLM proxy for the gateway tests, in its own virtual environment.

``litellm[proxy]`` is never installed into the project's environment (its pins would
constrain the user's): it lives in ``$ANABRANCH_LITELLM_VENV`` or, by default,
``~/.cache/anabranch/litellm-<version>``, created on first use (under a minute with a warm
pip cache). ``.ci/run`` creates it before the suite: ``python3 tests/litellm_proxy.py``.

The proxy is started on 127.0.0.1 with a generated ``config.yaml`` and stopped by whoever
started it; it never fetches its remote price map (``LITELLM_LOCAL_MODEL_COST_MAP``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

LITELLM_VERSION = "1.108.7"
"""The proxy release the suite runs against (the one measured in issue 19)."""
INSTALL_TIMEOUT = 600.0
START_TIMEOUT = 120.0
MASTER_KEY = "sk-anabranch-test"


def venv_dir() -> Path:
    configured = os.environ.get("ANABRANCH_LITELLM_VENV")
    if configured:
        return Path(configured)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "anabranch" / f"litellm-{LITELLM_VERSION}"


def litellm_executable() -> Path:
    return venv_dir() / "bin" / "litellm"


def ensure_installed() -> Path:
    """The ``litellm`` executable, installing the proxy into its own venv if needed."""
    venv = venv_dir()
    done = venv / ".anabranch-complete"
    if done.exists():
        return litellm_executable()
    subprocess.run(["rm", "-rf", str(venv)], check=True, timeout=60)
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check"]
    package = f"litellm[proxy]=={LITELLM_VERSION}"
    subprocess.run([*pip, package], check=True, timeout=INSTALL_TIMEOUT)
    done.write_text(LITELLM_VERSION + "\n")
    return litellm_executable()


@dataclass(frozen=True)
class Deployment:
    """One model group of the proxy: a name, the upstream it goes to, its limits."""

    model: str
    upstream: str
    max_input_tokens: int | None = None
    num_retries: int | None = None
    """The proxy's retries for this group (``None``: LiteLLM's default, 2)."""


def config_yaml(deployments: Sequence[Deployment]) -> str:
    """A proxy config: each deployment an ``anthropic/`` model at its upstream."""
    lines = ["model_list:"]
    for d in deployments:
        lines += [
            f"  - model_name: {d.model}",
            "    litellm_params:",
            f"      model: anthropic/{d.model}",
            f"      api_base: {d.upstream}",
            "      api_key: test",
        ]
        if d.num_retries is not None:
            lines.append(f"      num_retries: {d.num_retries}")
        if d.max_input_tokens is not None:
            lines += ["    model_info:", f"      max_input_tokens: {d.max_input_tokens}"]
    lines += [
        "router_settings:",
        "  enable_pre_call_checks: true",
        "general_settings:",
        f"  master_key: {MASTER_KEY}",
    ]
    return "\n".join(lines) + "\n"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Proxy:
    base_url: str
    process: subprocess.Popen[bytes]
    log_path: Path


def _wait_ready(proxy: Proxy, deadline: float) -> None:
    import httpx2  # not at the top: .ci/run runs this file with the system Python

    while time.monotonic() < deadline:
        if proxy.process.poll() is not None:
            raise RuntimeError(
                f"the LiteLLM proxy exited with {proxy.process.returncode}: "
                + proxy.log_path.read_text()[-2000:]
            )
        try:
            answer = httpx2.get(proxy.base_url + "/health/liveliness", timeout=2.0)
            if answer.status_code == 200:
                return
        except httpx2.TransportError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"the LiteLLM proxy did not start in {START_TIMEOUT:.0f} s")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=20)


@contextmanager
def running_proxy(deployments: Sequence[Deployment], workdir: Path) -> Iterator[Proxy]:
    """The real LiteLLM proxy on a free 127.0.0.1 port, stopped on exit."""
    executable = ensure_installed()
    config = workdir / "litellm.yaml"
    config.write_text(config_yaml(deployments))
    port = _free_port()
    log_path = workdir / "litellm.log"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", str(workdir)),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "NO_DOCKER": "1",
        "PYTHONUNBUFFERED": "1",
    }
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(executable), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            env=env,
            start_new_session=True,
        )
    proxy = Proxy(f"http://127.0.0.1:{port}", process, log_path)
    try:
        _wait_ready(proxy, time.monotonic() + START_TIMEOUT)
        yield proxy
    finally:
        _stop(process)


if __name__ == "__main__":  # .ci/run: create the venv before the suite
    print(ensure_installed())
