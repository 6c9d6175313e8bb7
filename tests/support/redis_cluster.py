"""A real local Redis Cluster for tests: 3 masters and 3 replicas on loopback ports.

Built from the ``redis-server`` binary (``--cluster-enabled yes``) and joined with
``redis-cli --cluster create``, both located or installed by :func:`tools.ensure_binary`.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from .binaries import ensure_binary


def _free_base(count: int) -> int:
    """A port P such that P..P+count-1 and their cluster-bus ports (+10000) are free."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count + 10000 >= 65535:
            continue
        ports = [p for i in range(count) for p in (base + i, base + i + 10000)]
        if all(_free(p) for p in ports):
            return base
    raise RuntimeError("no free range of ports for a local Redis Cluster")


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class LocalCluster:
    def __init__(self, masters: int = 3, replicas: int = 1, node_timeout_ms: int = 2000) -> None:
        self.server_bin = ensure_binary("redis-server", "redis-server")
        self.cli_bin = ensure_binary("redis-cli", "redis-tools")
        self.count = masters * (1 + replicas)
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.dir = Path(tempfile.mkdtemp(prefix="scraper-cluster-"))
        self.base = _free_base(self.count)
        self.ports = [self.base + i for i in range(self.count)]
        self.procs: dict[int, subprocess.Popen] = {}

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.live_ports()[0] if self.procs else self.ports[0]}"

    def start(self) -> LocalCluster:
        for port in self.ports:
            self._start_node(port)
        for port in self.ports:
            self._wait_ping(port)
        subprocess.run(
            [
                self.cli_bin,
                "--cluster",
                "create",
                *(f"127.0.0.1:{p}" for p in self.ports),
                "--cluster-replicas",
                str(self.replicas),
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        self.wait_ok()
        return self

    def _start_node(self, port: int) -> None:
        folder = self.dir / str(port)
        folder.mkdir(exist_ok=True)
        self.procs[port] = subprocess.Popen(
            [
                self.server_bin,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                str(self.node_timeout_ms),
                "--appendonly",
                "no",
                "--save",
                "",
                "--dir",
                str(folder),
                "--daemonize",
                "no",
                "--protected-mode",
                "no",
                "--logfile",
                str(folder / "redis.log"),
                # A replica promoted before its first full sync would hold nothing: sync at once.
                "--repl-diskless-sync-delay",
                "0",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def _wait_ping(self, port: int, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                redis.Redis(port=port, socket_timeout=1).ping()
                return
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=2)

    def wait_ok(self, timeout: float = 60) -> None:
        """Until every live node says the cluster is ok, 3 masters are reachable, and every live
        replica's link to its master is up (a replica that never synced cannot take over)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if (
                    all(
                        b"cluster_state:ok" in self.node(p).execute_command("CLUSTER", "INFO")
                        for p in self.live_ports()
                    )
                    and len(self.masters()) == self.count // (1 + self.replicas)
                    and all(self._synced(p) for p in self.live_ports())
                ):
                    return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("the local Redis Cluster did not reach cluster_state:ok")
            time.sleep(0.1)

    def _synced(self, port: int) -> bool:
        info = self.node(port).info("replication")
        return info.get("role") == "master" or info.get("master_link_status") == "up"

    def live_ports(self) -> list[int]:
        return [p for p, proc in self.procs.items() if proc.poll() is None]

    def masters(self) -> list[int]:
        """Ports of the live masters, by asking a live node."""
        text = self.node(self.live_ports()[0]).execute_command("CLUSTER", "NODES")
        text = text.decode() if isinstance(text, bytes) else text
        out = []
        for line in text.splitlines():
            fields = line.split()
            if "master" in fields[2] and "fail" not in fields[2] and fields[7] == "connected" and len(fields) > 8:
                out.append(int(fields[1].split("@")[0].rsplit(":", 1)[1]))
        return sorted(out)

    def master_of(self, key: str) -> int:
        slot = self.node(self.live_ports()[0]).execute_command("CLUSTER", "KEYSLOT", key)
        for start, end, (_host, port, *_), *_ in self.node(self.live_ports()[0]).execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return int(port)
        raise KeyError(key)

    def keys_by_master(self) -> dict[int, list[bytes]]:
        return {p: sorted(self.node(p).keys("*")) for p in self.masters()}

    def flushall(self) -> None:
        for port in self.masters():
            self.node(port).flushall()

    def kill(self, port: int) -> None:
        self.procs[port].send_signal(signal.SIGKILL)
        self.procs[port].wait(timeout=10)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)
