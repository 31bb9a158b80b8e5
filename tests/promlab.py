"""A real Prometheus and node_exporter for tests (Debian's packages), on loopback only:
node_exporter's textfile collector reads a folder the test writes fleetops' metrics into, Prometheus
scrapes it every second and evaluates the shipped alert rules every second. Both are stopped by pid
when the block ends.

    with Monitoring(tmp_path, rules) as mon:
        mon.wait_until("the check's series", lambda: mon.query('fleetops_check_ok{host="lab01"}'))
        mon.alerts()  # Prometheus' /api/v1/alerts, as Alertmanager would get them"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from polling import wait_for

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def available() -> bool:
    return bool(shutil.which("prometheus") and shutil.which("prometheus-node-exporter"))


class Monitoring:
    def __init__(self, workdir: Path, rules: Path, *, interval: str = "1s") -> None:
        self.dir = workdir / "monitoring"
        self.textfiles = self.dir / "textfile"
        self.rules, self.interval = rules, interval
        self.procs: list[subprocess.Popen] = []
        self.exporter_port = self.prometheus_port = 0

    def __enter__(self) -> Monitoring:
        self.textfiles.mkdir(parents=True, exist_ok=True)
        try:
            self._start_exporter()
            self._start_prometheus()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=20)
        for proc in self.procs:  # reaped: nothing of theirs outlives the test
            assert proc.returncode is not None

    def _spawn(self, argv: list[str], log: str) -> subprocess.Popen:
        out = open(self.dir / log, "wb")  # noqa: SIM115 - the process writes it until it is stopped
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, cwd=self.dir, start_new_session=True
        )
        out.close()
        self.procs.append(proc)
        return proc

    def _start_exporter(self) -> None:
        self.exporter_port = free_port()
        self._spawn(
            [
                "prometheus-node-exporter",
                f"--web.listen-address={LOOPBACK}:{self.exporter_port}",
                "--collector.disable-defaults",
                "--collector.textfile",
                f"--collector.textfile.directory={self.textfiles}",
            ],
            "node_exporter.log",
        )
        self._wait_http(f"http://{LOOPBACK}:{self.exporter_port}/metrics", "node_exporter.log")

    def _start_prometheus(self) -> None:
        self.prometheus_port = free_port()
        shutil.copy(self.rules, self.dir / "rules.yml")
        config = {
            "global": {"scrape_interval": self.interval, "evaluation_interval": self.interval},
            "rule_files": ["rules.yml"],
            "scrape_configs": [
                {
                    "job_name": "node",
                    "static_configs": [{"targets": [f"{LOOPBACK}:{self.exporter_port}"]}],
                }
            ],
        }
        (self.dir / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        self._spawn(
            [
                "prometheus",
                f"--config.file={self.dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address={LOOPBACK}:{self.prometheus_port}",
            ],
            "prometheus.log",
        )
        self._wait_http(f"http://{LOOPBACK}:{self.prometheus_port}/-/ready", "prometheus.log")

    def _wait_http(self, url: str, log: str, timeout: float = 60) -> None:
        def ready() -> bool:
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"{log} ended early:\n{(self.dir / log).read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(url, timeout=2) as answer:
                    return answer.status == 200
            except OSError:
                return False

        try:
            wait_for(ready, f"{url} to answer", timeout, every=0.2)
        except AssertionError as exc:
            raise RuntimeError(f"{exc}:\n{(self.dir / log).read_text()[-2000:]}") from None

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        url = f"http://{LOOPBACK}:{self.prometheus_port}/api/v1/{path}{query}"
        with urllib.request.urlopen(url, timeout=10) as answer:
            doc = json.load(answer)
        assert doc["status"] == "success", doc
        return doc["data"]

    def query(self, expr: str) -> list[dict]:
        return self.api("query", query=expr)["result"]

    def alerts(self) -> list[dict]:
        return self.api("alerts")["alerts"]

    def wait_until(self, what: str, check: Any, timeout: float = 60) -> Any:
        """Polls `check()` until it returns something truthy (then returns it), at most `timeout`
        seconds: Prometheus scrapes and evaluates once a second, no need to ask more often."""
        return wait_for(check, what, timeout, every=0.5)

    def put(self, name: str, source: Path) -> None:
        """A metrics file into the collector's folder, as a timer would leave it (renamed into
        place)."""
        temp = self.textfiles / f".{name}.tmp"
        shutil.copy(source, temp)
        os.replace(temp, self.textfiles / name)
