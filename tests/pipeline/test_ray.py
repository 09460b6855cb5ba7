"""Rollout workers as Ray actors (``--rollout-backend ray``) on a real Ray cluster of two nodes started on this
machine (a head on 127.0.0.2 and a second node on 127.0.0.3, each with a custom resource of its own): actors
placed on both nodes, weights through the object store, the per-token bound, a deterministic run equal to the
local backend's, a killed trainer resumed losslessly, a killed actor as one line naming it and its node, a
lost node survived with restarts, and no process of a Ray that lrl started left behind."""

from __future__ import annotations

import copy
import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
from conftest import quick_cfg
from helpers import (
    MARK,
    ROOT,
    Tokens,
    history_lines,
    ledger_is_lossless,
    marked_env,
    merged,
    one_clear_line,
    processes_of,
    train,
    wait_until,
)
from helpers import two_worker_args as args

from lrl.pipeline.backends.ray.cluster import RayNode
from lrl.pipeline.backends.ray.keeper import MARKER
from lrl.pipeline.policies import OldestFirst
from lrl.run import build_run, fit

# skipped, saying how to install it, where Ray is missing (conftest); the module's cluster on one worker
pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]

# the cluster's GCS declares a node dead after about 2 s of failed health checks (Ray's default: 15 s)
HEALTH = {"RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "4"}
TIMING = ("time/", "pipeline/trainer_wait", "pipeline/worker_idle", "pipeline/episodes_per_s")
TIMING += ("pipeline/queue_depth", "pipeline/slot_util", "pipeline/generating", "pipeline/tool_wait")
TIMING += ("pipeline/episode_seconds", "pipeline/launched_seconds", "pipeline/restarts", "pipeline/lost")
TIMING += ("pipeline/occ",)


class Cluster:
    """The module's two Ray nodes."""

    def __init__(self, head: RayNode, second: RayNode):
        self.head = head
        self.second = second
        self.address = head.address

    def actors(self, node: RayNode | None = None) -> list[int]:
        """Pids of rollout actors on `node` (or on either)."""
        found = []
        for each in [node] if node else [self.head, self.second]:
            for pid in each.pids:
                try:
                    if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::RolloutActor"):
                        found.append(pid)
                except OSError:
                    pass
        return found


@pytest.fixture(scope="module", autouse=True)
def module_mark():
    """Every process this module's runs start carries one marker (the test cluster's own do not)."""
    mark = uuid.uuid4().hex
    os.environ[MARK] = mark
    yield mark
    os.environ.pop(MARK, None)


@pytest.fixture(scope="module")
def cluster(module_mark):
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")}
    own = {**HEALTH, MARK: "cluster"}  # not lrl's: the final check looks for lrl's own
    head = RayNode.start(num_cpus=2, resources={"nodeA": 1}, extra_env=own, wait=False)
    second = RayNode.start(
        head=head.address,
        ip="127.0.0.3",
        num_cpus=1,
        resources={"nodeB": 1},
        env=head.env,
        folder=head.folder,
        extra_env=own,
        wait=False,
    )  # launched together: it joins once the head is up
    try:
        head.wait_started()
        second.wait_started()
    except BaseException:
        second.stop()
        head.stop()
        raise
    os.environ.update(head.env)  # the cluster's token, for the runs that attach to it
    yield Cluster(head, second)
    for key, value in saved.items():
        os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
    second.stop()
    assert not head.stop()


def popen(arguments: list[str], env=None, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), *arguments],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        **kw,
    )


def finished(proc: subprocess.Popen, timeout: float = 120):
    out, err = proc.communicate(timeout=timeout)
    return type("Done", (), {"returncode": proc.returncode, "stdout": out, "stderr": err})


def without_timing(lines: list[dict]) -> list[dict]:
    return [{k: v for k, v in h.items() if not k.startswith(TIMING) and k != "run"} for h in lines]


DETERMINISTIC = ["--deterministic", "true", "--max-staleness", "1", "--max-steps", "4"]


@pytest.fixture(scope="module")
def local_deterministic(model_dir, tmp_path_factory):
    """The deterministic run on the local backend, the result every Ray run below must give."""
    folder = tmp_path_factory.mktemp("local")
    out = train(*args(model_dir, folder, *DETERMINISTIC, "--history-file", str(folder / "h.jsonl")))
    one_clear_line(out, 0)
    return history_lines(folder / "h.jsonl")


# -- placement, weights and the bound -------------------------------------------------------------------
def ray_cfg(cluster, **kw):
    """Six steps at bound 1 on two actors of the test cluster."""
    base = dict(
        pipeline="async",
        rollout_backend="ray",
        ray_address=cluster.address,
        rollout_workers=2,
        max_staleness=1,
        max_steps=6,
        tasks_per_step=4,
        eval_at_start=False,
    )
    return quick_cfg(**{**base, **kw})


@pytest.mark.slow  # 62 s on 2 cores: out of the default run (pytest -m slow)
def test_two_actors_are_placed_on_two_nodes_and_the_bound_holds_per_token(cluster, format_policy):
    tokens = Tokens()
    cfg = ray_cfg(cluster)
    run = build_run(cfg, callbacks=[tokens], logger=False, policy=copy.deepcopy(format_policy))
    fit(run)
    assert tokens.staleness and max(tokens.staleness) <= 1
    assert max(tokens.staleness) >= 1  # the actors ran ahead of the trainer
    places = run.source.workers.places
    assert sorted(p["ip"] for p in places) == ["127.0.0.2", "127.0.0.3"], places  # one actor on each node
    stats = run.source.window.stats
    assert all(stats[w].switches >= 2 for w in (0, 1)), (
        stats
    )  # both loaded new versions from the object store
    trained, dropped = ledger_is_lossless(run.module.history)
    assert trained + dropped >= 6 * 16
    wait_until(lambda: not cluster.actors(), 15, "the run's actors to end")


@pytest.mark.slow  # 10-20 s each once the cluster is up
@pytest.mark.parametrize("policy", ["mask", "abort", "oldest-first", "cut", "ordered"])
def test_every_staleness_policy_keeps_the_bound_on_ray_actors(cluster, format_policy, policy):
    tokens = Tokens()
    cfg = ray_cfg(
        cluster,
        slots=8,
        stale_policy=policy,
        tool_latency="lognormal:0.02:2.0",  # stragglers: the policy has work past the bound to act on
        # abort acts only on an episode still in flight when its worker sees the version that puts it past the
        # bound; in six steps most runs had one, but two slow runs had none and failed: twelve steps
        max_steps=12 if policy == "abort" else 6,
    )
    run = build_run(cfg, callbacks=[tokens], logger=False, policy=copy.deepcopy(format_policy))
    fit(run)
    assert tokens.staleness and max(tokens.staleness) <= 1
    history = run.module.history
    ledger_is_lossless(history)
    assert all(h["pipeline/wasted_tokens"] <= h["pipeline/decoded_tokens"] for h in history)
    # the policy acted on the actors' work, not only the option was accepted
    acted = {
        "mask": "pipeline/masked_tokens",
        "abort": "pipeline/aborted",
        "cut": "pipeline/cut",
    }
    if policy in acted:
        assert sum(h[acted[policy]] for h in history) > 0, [h[acted[policy]] for h in history]
    elif policy == "ordered":  # nothing passes the bound: nothing is dropped
        assert all(h["dropped_ids"] == [] for h in history)
    else:  # oldest-first acts in the controller's schedule, the same whatever the backend
        assert isinstance(run.source.schedule.policy, OldestFirst)
    wait_until(lambda: not cluster.actors(), 15, "the run's actors to end")


# -- the backend does not change the result ----------------------------------------------------------------
@pytest.mark.slow  # 35 s on 2 cores: out of the default run (pytest -m slow)
def test_a_deterministic_run_on_ray_equals_the_local_one(cluster, model_dir, tmp_path, local_deterministic):
    history = tmp_path / "h.jsonl"
    extra = ["--rollout-backend", "ray", "--ray-address", cluster.address, "--history-file", str(history)]
    out = train(*args(model_dir, tmp_path, *DETERMINISTIC, *extra))
    one_clear_line(out, 0)
    ray_history = history_lines(history)
    assert [h["trained_ids"] for h in ray_history] == [h["trained_ids"] for h in local_deterministic]
    assert without_timing(ray_history) == without_timing(local_deterministic)
    assert max(h["staleness/token_max"] for h in ray_history) == 1  # concurrent and stale, yet the same


# -- a killed trainer, resumed ------------------------------------------------------------------------------
@pytest.mark.slow  # 51 s on 2 cores: out of the default run (pytest -m slow)
def test_a_killed_trainer_resumes_losslessly_and_the_cluster_ends_its_actors(cluster, model_dir, tmp_path):
    history = tmp_path / "h.jsonl"
    steps = 8
    common = args(model_dir, tmp_path / "runs", "--max-steps", str(steps), "--checkpoint-every", "1")
    common += ["--history-file", str(history), "--resume", "last"]
    killed = popen([*common, "--rollout-backend", "ray", "--ray-address", cluster.address])
    wait_until(lambda: len(history_lines(history)) >= 2 or killed.poll() is not None, 120, "two steps")
    killed.send_signal(signal.SIGKILL)
    killed.communicate()
    assert killed.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    before = history_lines(history)
    wait_until(lambda: not cluster.actors(), 20, "the cluster to end the dead run's actors")
    done = train(*common)  # resumed on the local backend: the checkpoint is the same on either
    one_clear_line(done, 0)
    after = history_lines(history)[len(before) :]
    whole = merged([before, after])
    assert [h["step"] for h in whole] == list(range(steps))
    trained, _ = ledger_is_lossless(whole)
    assert trained > 0
    assert all(h["staleness/token_max"] <= 1 for h in whole)


KEEPER_PARENT = """
import time
from lrl.pipeline.backends.ray.cluster import RayNode
node = RayNode.start(num_cpus=1)
print(node.keeper.pid, flush=True)
time.sleep(600)
"""


def test_a_ray_whose_starter_is_killed_is_stopped_by_its_keeper():
    env, mark = marked_env()
    starter = subprocess.Popen(
        [sys.executable, "-c", KEEPER_PARENT], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )
    assert int(starter.stdout.readline()) in processes_of(mark)  # the keeper is up, and carries the marker
    assert len(processes_of(mark)) > 3, "the node did not start"  # the starter, the keeper, Ray's processes
    starter.send_signal(signal.SIGKILL)  # as a trainer killed with SIGKILL: nothing runs its cleanup
    starter.communicate()
    wait_until(lambda: not processes_of(mark), 20, "every process of the node and its keeper to end")


@pytest.mark.slow  # 20 s; the keeper's stop after a SIGKILL runs by default
def test_a_run_with_its_own_ray_stops_on_sigterm_to_its_group_and_leaves_nothing(model_dir, tmp_path):
    history = tmp_path / "h.jsonl"
    ckpts = tmp_path / "ck"
    extra = ["--rollout-backend", "ray", "--max-steps", "1000", "--checkpoint-every", "100"]
    extra += ["--checkpoint-dir", str(ckpts), "--history-file", str(history)]
    env, mark = marked_env()
    proc = popen(args(model_dir, tmp_path / "runs", *extra), env=env, start_new_session=True)
    wait_until(lambda: len(history_lines(history)) >= 2 or proc.poll() is not None, 120, "two steps")
    os.killpg(proc.pid, signal.SIGTERM)  # Ray's processes are in a session of their own: the run stops them
    done = finished(proc, timeout=60)
    one_clear_line(done, 143, "stopped by SIGTERM after step", "continue with")
    assert (ckpts / "last.ckpt").is_file()
    wait_until(lambda: not processes_of(mark), 15, "every process of the run and of its Ray to end")


# -- faults -------------------------------------------------------------------------------------------------
def after_first_step(history: Path, action) -> threading.Thread:
    """Run `action()` once `history` has its first line (the run goes on in this process meanwhile)."""

    def watch():
        wait_until(lambda: history_lines(history), 120, "the first step")
        action()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow  # 17 s on 2 cores: out of the default run (pytest -m slow)
def test_a_killed_actor_ends_the_run_with_one_line_naming_it_and_its_node(cluster, model_dir, tmp_path):
    history = tmp_path / "h.jsonl"
    extra = ["--rollout-backend", "ray", "--ray-address", cluster.address, "--max-steps", "60"]
    after_first_step(history, lambda: os.kill(cluster.actors(cluster.second)[0], signal.SIGKILL))
    done = train(*args(model_dir, tmp_path, *extra, "--history-file", str(history)))
    one_clear_line(done, 5, "rollout worker", "127.0.0.3", "died")
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "(raylet)" not in done.stdout  # Ray's own report of the death goes to the debug log
    wait_until(lambda: not cluster.actors(), 15, "the run's actors to end")


def cpus_in_use(cluster) -> float:
    """The cluster's CPUs held by actors, as `ray status` reports them."""
    out = subprocess.run(
        ["ray", "status", "--address", cluster.address], capture_output=True, text=True, timeout=60
    ).stdout
    found = re.search(r"([0-9.]+)/([0-9.]+) CPU", out)
    return float(found.group(1)) if found else float("inf")


@pytest.mark.slow  # 29 s on 2 cores: out of the default run (pytest -m slow)
def test_a_lost_node_is_survived_with_restarts_and_the_result_does_not_change(
    cluster, model_dir, tmp_path, local_deterministic
):
    # the actors of the run before must have given their CPUs back, or SPREAD may place both actors on the head
    # and the lost node hold nothing of the run
    wait_until(lambda: cpus_in_use(cluster) == 0, 30, "the cluster's CPUs to be free", poll=0.5)
    history = tmp_path / "h.jsonl"
    extra = ["--rollout-backend", "ray", "--ray-address", cluster.address, "--worker-restarts", "1"]

    def lose_the_second_node():
        # as soon as the run's actor is on it: its share of every step is still to come, so the run must notice
        # (killed after the first step instead, a loaded machine could finish the four steps before it did)
        wait_until(lambda: cluster.actors(cluster.second), 120, "the run's actor on the second node")
        cluster.second.kill()  # the second node goes down at once, its actor with it

    threading.Thread(target=lose_the_second_node, daemon=True).start()
    done = train(*args(model_dir, tmp_path, *DETERMINISTIC, *extra, "--history-file", str(history)))
    # (the node is named where the actor had reported its place: the killed-actor test above checks that)
    one_clear_line(done, 0, "rollout worker", "died", "restarting it")
    lines = history_lines(history)
    assert sum(h["pipeline/restarts"] for h in lines) == 1
    assert sum(h["pipeline/lost"] for h in lines) > 0
    # the lost batch was generated again on its own version and seeds: the same result, nothing trained twice
    assert without_timing(lines) == without_timing(local_deterministic)
    ledger_is_lossless(lines)


# -- last: nothing of lrl's Ray is left ----------------------------------------------------------------------
def test_no_process_of_a_ray_that_lrl_started_is_left(module_mark):
    def left() -> list[int]:  # processes of this module's runs that belong to a Ray node lrl started
        found = []
        for pid in processes_of(module_mark):
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(item.startswith(MARKER.encode() + b"=") for item in environ):
                found.append(pid)
        return found

    wait_until(lambda: not left(), 15, "every process of the Ray nodes lrl's runs started to end")
