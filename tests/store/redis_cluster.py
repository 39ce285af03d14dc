"""A real Redis Cluster on loopback that a test session starts and tears down.

Each node is a ``redis-server --cluster-enabled yes`` with its own directory, a
free client port and a free cluster-bus port (``--cluster-port``, Redis 7+);
``redis-cli --cluster create`` then spreads the 16384 slots over the nodes, no
replicas. Both binaries come from Debian's ``redis-server`` package (which pulls
in ``redis-tools``, the package of ``redis-cli``).
"""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from pathlib import Path

import redis as redis_py

from c2c.testing import free_port


class RedisClusterNodes:
    """``nodes`` cluster-enabled redis-servers on 127.0.0.1, joined by ``redis-cli --cluster create``."""

    def __init__(self, directory: Path, *, server_bin: str, cli_bin: str, nodes: int = 3):
        self.dir = Path(directory)
        self.server_bin, self.cli_bin, self.count = server_bin, cli_bin, nodes
        ports: list[int] = []
        while len(ports) < 2 * nodes:  # a client port and a bus port per node, all distinct
            if (p := free_port()) not in ports:
                ports.append(p)
        self.ports, self.bus_ports = ports[:nodes], ports[nodes:]
        self.procs: list[subprocess.Popen] = []

    def start(self) -> "RedisClusterNodes":
        try:
            for port, bus in zip(self.ports, self.bus_ports):
                d = self.dir / str(port)
                d.mkdir(parents=True, exist_ok=True)
                self.procs.append(subprocess.Popen(
                    [self.server_bin, "--port", str(port), "--cluster-port", str(bus), "--bind", "127.0.0.1",
                     "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
                     "--cluster-node-timeout", "5000", "--dir", str(d), "--save", "", "--appendonly", "no",
                     "--daemonize", "no", "--logfile", str(d / "redis.log")],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            for port in self.ports:
                self._wait(port, lambda r: r.ping(), "answer PING")
            create = subprocess.run(
                [self.cli_bin, "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                 "--cluster-replicas", "0", "--cluster-yes"], capture_output=True, text=True, timeout=60)
            if create.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed:\n{create.stdout[-2000:]}{create.stderr}")
            for port in self.ports:
                self._wait(port, self._ready, "report cluster_state:ok with every slot and node")
        except BaseException:
            self.stop()
            raise
        return self

    def _ready(self, r: redis_py.Redis) -> bool:
        info = r.cluster("info")
        return (info.get("cluster_state") == "ok" and int(info.get("cluster_slots_ok", 0)) == 16384
                and int(info.get("cluster_known_nodes", 0)) == self.count)

    def _wait(self, port: int, ok, what: str, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for proc, p in zip(self.procs, self.ports):
                if proc.poll() is not None:
                    log = (self.dir / str(p) / "redis.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"cluster node {p} exited with {proc.returncode}:\n{log}")
            try:
                with redis_py.Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.5,
                                    socket_timeout=2) as r:
                    if ok(r):
                        return
            except redis_py.RedisError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"cluster node {port} did not {what} within {timeout_s:g} s")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self.procs = []

    def url(self, domain: str | None = None, **options) -> str:
        """A ``cluster=1`` store URL starting from the first node, in a fresh domain unless given."""
        domain = domain or f"t{uuid.uuid4().hex[:10]}"
        query = "&".join([f"domain={domain}", "cluster=1", *(f"{k}={v}" for k, v in options.items())])
        return f"redis://127.0.0.1:{self.ports[0]}/0?{query}"
