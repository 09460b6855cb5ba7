"""Ray for the rollout actors: a node lrl starts on this machine and stops with the run, or a cluster it attaches
to and leaves as it was; the driver's connection either way.

A node lrl starts (:class:`RayNode`) runs under a keeper (:mod:`lrl.pipeline.backends.ray.keeper`), in a session of its
own, with everything it writes (session folder, logs, sockets, the authentication token) in a temporary folder
of the run, removed when it stops:

- it is advertised on an explicit loopback address other than 127.0.0.1 (:data:`LOOPBACK`), which Ray would
  replace by the machine's interface address, so every connection between its processes stays on loopback;
- token authentication with a token of its own (``RAY_AUTH_MODE=token``, ``RAY_AUTH_TOKEN_PATH``) for every
  process of the node and for the driver, never ``~/.ray``;
- ports picked free at start, so that two runs (or two test sessions) never clash on Ray's fixed defaults.

:class:`RayRuntime` is the run's view: ``connect()`` starts a node when no address is given (or attaches to the
given one), ``close()`` disconnects and, for a node it started, stops every process of it.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from lrl.pipeline.backends.ray.keeper import MARKER, kill_marked, marked
from lrl.reaper import OUTER_TMPDIR

LOOPBACK = "127.0.0.2"  # Ray resolves 127.0.0.1 to the interface address on purpose; any other loopback stays
REACH_SECONDS = 10.0  # a cluster's head that does not accept a TCP connection by then is unreachable
START_SECONDS = 120.0  # a node's `ray start` on two busy cores took 10-12 s; a hard limit for a stuck one
STOP_SECONDS = 15.0
AUTH = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN")
logger = logging.getLogger("lrl.ray")


class RayStartError(RuntimeError):
    """A Ray node would not start, or a cluster could not be reached; the message says why."""


def free_port() -> int:
    """A TCP port free on every address right now (Ray's servers bind the wildcard address)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def auth_files(folder: Path) -> dict[str, str]:
    """A fresh token in `folder` (mode 600) -> the environment every process of the cluster needs."""
    token = folder / "auth_token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}


class RayNode:
    """One Ray node on this machine, started through its keeper; stopped (every process) by :meth:`stop`."""

    def __init__(self, keeper: subprocess.Popen, marker: str, folder: Path, ip: str, log: Path, env: dict):
        self.keeper = keeper
        self.marker = marker
        self.folder = folder
        self.ip = ip
        self.log = log
        self.env = env  # the authentication environment of the cluster (a second node and the driver need it)
        self.address: str | None = None  # head only: the GCS address, HOST:PORT

    @classmethod
    def start(
        cls,
        *,
        head: str | None = None,
        ip: str = LOOPBACK,
        num_cpus: float | None = None,
        resources: dict | None = None,
        env: dict | None = None,
        folder: Path | None = None,
        extra_env: dict | None = None,
        wait: bool = True,
    ) -> RayNode:
        """A head node (`head` None) or a node joining the head at `head` (HOST:PORT), on address `ip`, with
        `num_cpus` and custom `resources`; `env` is the cluster's authentication (a fresh token for a head).
        With `wait` false it returns once the node is launching (:meth:`wait_started` then waits for it)."""
        own = folder is None
        # not in the run's own temporary folder: Ray's socket paths must stay short (a node's keeper removes it)
        outer = os.environ.get("RAY_TMPDIR") or os.environ.get(OUTER_TMPDIR)
        folder = Path(folder or tempfile.mkdtemp(prefix="lrl-ray-", dir=outer))
        env = dict(env or auth_files(folder))
        command = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--node-ip-address", ip]
        command += ["--disable-usage-stats", "--temp-dir", str(folder)]
        command += ["--dashboard-agent-listen-port", str(free_port()), "--include-log-monitor", "false"]
        if head is None:
            port = free_port()
            command += ["--head", "--port", str(port), "--include-dashboard", "false"]
            command += ["--ray-client-server-port", str(free_port())]
        else:
            command += ["--address", head]
        if num_cpus is not None:
            command += ["--num-cpus", f"{num_cpus:g}"]
        if resources:
            command += ["--resources", json.dumps(resources)]
        marker = uuid.uuid4().hex
        keeper_command = [
            sys.executable,
            "-m",
            "lrl.pipeline.backends.ray.keeper",
            "--parent",
            str(os.getpid()),
        ]
        keeper_command += ["--marker", marker, *(["--remove", str(folder)] if own else []), "--", *command]
        log = folder / f"node-{ip}.log"
        node_env = {**os.environ, **env, **(extra_env or {}), "RAY_TMPDIR": str(folder)}
        node_env["RAY_USAGE_STATS_ENABLED"] = "0"
        node_env[MARKER] = marker  # the keeper too: nothing of the node outlives the check for it
        with open(log, "w") as out:
            keeper = subprocess.Popen(
                keeper_command,
                env=node_env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C and SIGTERM to the trainer's process group do not reach Ray
            )
        node = cls(keeper, marker, folder, ip, log, env)
        if head is None:
            node.address = f"{ip}:{port}"
        if wait:
            node.wait_started()
        return node

    def wait_started(self, timeout: float = START_SECONDS) -> None:
        """Until `ray start` says the node runs; a keeper that exits first is an error with the log's tail. The
        node is stopped when it fails to start (or a signal interrupts the wait)."""
        try:
            self._wait_started(timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_started(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "Ray runtime started." in self._log_text():
                return
            if self.keeper.poll() is not None:
                raise RayStartError(f"the Ray node on {self.ip} did not start: {self._log_tail()}")
            time.sleep(0.1)
        raise RayStartError(
            f"the Ray node on {self.ip} did not start within {timeout:g} s: {self._log_tail()}"
        )

    def _log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def _log_tail(self) -> str:
        lines = [line.strip() for line in self._log_text().splitlines() if line.strip()]
        return " | ".join(lines[-3:]) or "(no output)"

    @property
    def pids(self) -> list[int]:
        """Every live process of the node (the keeper not included)."""
        return marked(self.marker, exclude=self.keeper.pid)

    def stop(self, timeout: float = STOP_SECONDS) -> list[int]:
        """Stop the node and every process of it -> the pids still alive after `timeout` (none, normally)."""
        if self.keeper.poll() is None:
            self.keeper.send_signal(signal.SIGTERM)
            try:
                self.keeper.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.keeper.kill()
                self.keeper.wait(timeout=2)
        # the keeper is gone: what it left is ours to end
        return kill_marked(self.marker, time.monotonic() + 2, exclude=self.keeper.pid)

    def kill(self) -> None:
        """Lose the node at once, as a machine that goes down: SIGKILL every process of it (keeper included)."""
        self.keeper.kill()
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self.keeper.wait(timeout=5)


class RayRuntime:
    """The run's Ray: a one-node instance lrl starts (no address) or an existing cluster (HOST:PORT or auto)."""

    def __init__(self, address: str | None, num_cpus: float):
        self.address = address
        self.num_cpus = (
            num_cpus  # of a node lrl starts: what its actors declare, at least the machine's cores
        )
        self.node: RayNode | None = None
        self.connected = False
        self._saved_env: dict[str, str | None] = {}
        self._quiet = None  # undoes _quiet_job_errors

    def connect(self):
        """Ray, connected (started first when lrl owns it) -> the ray module."""
        import ray

        if self.connected:
            return ray
        if ray.is_initialized():
            raise RayStartError(
                "this process is already connected to Ray; lrl connects to --ray-address itself (or starts its own)"
            )
        if self.address is None:
            self.node = RayNode.start(num_cpus=self.num_cpus)
            address, host = self.node.address, self.node.ip
            self._set_env(self.node.env)
        else:
            address = self._resolve(self.address)
            host = address.rsplit(":", 1)[0]
            _refresh_auth()  # the cluster's token (the environment's), not one an earlier connection read
        kw = {"_node_ip_address": host} if is_loopback(host) else {}
        try:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False, **kw)
        except Exception as err:  # noqa: BLE001 (whatever Ray raises, the run stops with one line)
            self.close()
            detail = " ".join(str(err).split())[:300]
            raise RayStartError(
                f"cannot connect to Ray at {address}: {type(err).__name__}: {detail}"
            ) from None
        self.connected = True
        self._quiet = _quiet_job_errors()
        return ray

    @staticmethod
    def _resolve(address: str) -> str:
        """HOST:PORT of `address` ('auto': RAY_ADDRESS, else the cluster `ray start` last started here), checked
        to answer on TCP within REACH_SECONDS: ray.init itself retries an address that does not answer for
        minutes."""
        where = "--ray-address"
        if address == "auto":
            address, where = _recorded_address()
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=REACH_SECONDS):
                pass
        except (OSError, ValueError) as err:
            reason = getattr(err, "strerror", None) or str(err) or type(err).__name__
            raise RayStartError(
                f"cannot reach the Ray cluster at {address} (from {where}): {reason.lower()} (tried for up to "
                f"{REACH_SECONDS:g} s); start it (ray start --head) or give the address of its head"
            ) from None
        return address

    def _set_env(self, env: dict) -> None:
        """The cluster's authentication for this process (the driver), restored by close()."""
        for key in AUTH:
            self._saved_env.setdefault(key, os.environ.get(key))
            os.environ.pop(key, None)
        os.environ.update(env)
        _refresh_auth()

    def close(self) -> None:
        """Disconnect; stop the node lrl started (every process of it); restore the environment."""
        if self.connected:
            import ray

            try:
                ray.shutdown()
            except Exception:  # noqa: BLE001 (a cluster already gone must not stop the run's own cleanup)
                pass
            self.connected = False
            if self._quiet is not None:
                self._quiet()
                self._quiet = None
        if self.node is not None:
            left = self.node.stop()
            self.node = None
            if left:
                print(f"lrl: Ray processes {left} did not stop", file=sys.stderr)
        if self._saved_env:
            for key, value in self._saved_env.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            self._saved_env = {}
            _refresh_auth()


def _recorded_address() -> tuple[str, str]:
    """--ray-address auto: RAY_ADDRESS, else the address `ray start` recorded on this machine -> (address, where
    it came from). Read from the file Ray writes (ray/ray_current_cluster in the system's temporary folder),
    not through Ray's private functions, which move between releases."""
    found = os.environ.get("RAY_ADDRESS", "").strip()
    if found:
        return found, "RAY_ADDRESS"
    folders = [os.environ.get("RAY_TMPDIR"), os.environ.get(OUTER_TMPDIR), tempfile.gettempdir(), "/tmp"]
    for folder in dict.fromkeys(f for f in folders if f):
        record = Path(folder) / "ray" / "ray_current_cluster"
        try:
            text = record.read_text().strip()
        except OSError:
            continue
        if text:
            return text, str(record)
    raise RayStartError(
        "ray_address: auto found no running cluster (no RAY_ADDRESS, no cluster started with `ray start` on "
        "this machine); give HOST:PORT, or leave it out to start one with the run"
    )


def _quiet_job_errors():
    """Send the errors Ray's cluster reports about this job (an actor's death, in Ray's words, with colour codes,
    printed on stdout by the driver) to the ``lrl.ray`` log at debug level: the run reports them itself, in one
    line naming the worker and its node. -> a function that undoes it."""
    import ray._private.worker as driver

    printed = driver.print_to_stdstream

    def sink(data, ignore_prefix):
        if data.get("pid") != "raylet":
            return printed(data, ignore_prefix)
        for line in data.get("lines", []):
            logger.debug("ray: %s", line)

    driver.print_to_stdstream = sink

    def undo():
        driver.print_to_stdstream = printed

    return undo


def _refresh_auth() -> None:
    """Make Ray in this process read the authentication settings again (its token is cached once read)."""
    try:
        from ray._raylet import AuthenticationTokenLoader, Config
    except ImportError:
        return
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()
