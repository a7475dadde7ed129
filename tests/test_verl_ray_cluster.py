"""verl's ranks on a Ray cluster the configuration names (`ray_address`): two Ray nodes started on this
machine (a head and one more, ray.cluster_utils, 2 CPUs each: one rank's actor and reference workers), the
trainer joining them at world size 2 with `verl.trainer.nnodes: 2`, one rank on each node. The update is
world size 1's on the same batch (the tolerance and the comparison of tests/test_verl_world_size.py).

A cluster that does not answer, or cannot hold the ranks, stops the trainer before it loads the model or
starts a worker, with an error that names the setting, the address and what the cluster has.
"""

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
import torch
import yaml
from otel_rl_server import OTEL_RL
from ray.cluster_utils import Cluster
from test_train_verl import rows, served_batch, settings
from test_verl_world_size import COMPARED, RELATIVE, weights

from otel_rl.train.config import ConfigError, config_from_dict
from otel_rl.train.trainer import Trainer
from otel_rl.train.verl import VerlTrainer
from otel_rl.train.verl.world import PROBE_TIMEOUT_S

pytestmark = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="two ranks, a process each, need 2 CPU cores"
)


def run(config: dict, batch, folder: Path) -> tuple[list[dict], dict[str, torch.Tensor], set[str]]:
    """Two updates on `batch` (the second: KL against the reference counts), the weights after them, and
    the Ray nodes verl's placement groups (a node's share of the ranks each) were placed on."""
    trainer = VerlTrainer(config_from_dict(config))
    try:
        metrics = [trainer.step(batch) for _ in range(2)]
        table = ray.util.placement_group_table().values()
        nodes = {node for group in table for node in group["bundles_to_node_id"].values()}
        saved = trainer.save(folder / "step-2")
    finally:
        trainer.close()
    return metrics, weights(saved), nodes


@pytest.fixture(scope="module")
def batch(tiny_model_dir):
    """The 7-sample batch of tests/test_verl_world_size.py (odd: two ranks need the padding)."""
    local = Trainer(config_from_dict(settings(tiny_model_dir)))
    return served_batch(local, rows(local.tokenizer)).select_idxs(list(range(7)))


@pytest.fixture(scope="module")
def one_rank(tiny_model_dir, batch, tmp_path_factory):
    """World size 1 on the Ray the trainer starts itself."""
    return run(settings(tiny_model_dir, backend="verl", world_size=1), batch, tmp_path_factory.mktemp("one"))


@pytest.fixture(scope="module")
def cluster(one_rank) -> Iterator[Cluster]:
    """A head and one more Ray node on this machine, 2 CPUs each, in a Ray temp folder of their own
    (RAY_TMPDIR, which also holds the `ray_current_cluster` file a bare `ray.init()` looks for): no other
    test's or person's Ray on this machine finds them. Shut down, and the folder removed, after the module.

    Started after `one_rank`: the first `ray.init()` that starts Ray turns this process to Ray's token
    authentication (RAY_AUTH_MODE=token, a token in ~/.ray/auth_token); nodes started before it run
    without, and refuse the workers of a driver that has since turned ("The actor never ran - it was
    cancelled before it started running"). Started after, the nodes inherit the mode and the token."""
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    previous = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = temp
    try:
        # No dashboard, and the agents on ports of their own: other Ray instances may run beside these.
        nodes = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 2, "include_dashboard": False, "dashboard_agent_listen_port": None},
        )
        try:
            nodes.add_node(num_cpus=2, dashboard_agent_listen_port=None)
            nodes.wait_for_nodes()
            yield nodes
        finally:
            nodes.shutdown()
    finally:
        if previous is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = previous
        shutil.rmtree(temp, ignore_errors=True)


def on_cluster(model: Path, address: str, nodes: int, **overrides) -> dict:
    """Training settings with `nodes` ranks, one a node, on the Ray cluster at `address`."""
    return settings(
        model,
        backend="verl",
        world_size=nodes,
        ray_address=address,
        verl={"trainer": {"nnodes": nodes}},
        **overrides,
    )


@pytest.fixture(scope="module")
def two_nodes(tiny_model_dir, batch, cluster, tmp_path_factory):
    """World size 2 over the two nodes, joined through `ray_address`."""
    config = on_cluster(tiny_model_dir, cluster.address, 2)
    return run(config, batch, tmp_path_factory.mktemp("two_nodes"))


def test_two_ranks_on_two_ray_nodes_give_one_ranks_update(one_rank, two_nodes, cluster):
    (one, _, _), (two, _, nodes) = one_rank, two_nodes
    assert nodes == {node.node_id for node in cluster.list_all_nodes()}  # a rank on each of the two nodes
    for step_one, step_two in zip(one, two, strict=True):
        assert step_two["samples"] == step_one["samples"] == 7
        for name in COMPARED:
            assert step_two[name] == pytest.approx(step_one[name], rel=RELATIVE, abs=1e-7), name
    assert two[1]["kl_loss"] > 1e-4  # the reference workers (on both nodes too) entered the update


def test_two_ranks_on_two_ray_nodes_give_one_ranks_new_weights(one_rank, two_nodes, tiny_model_dir):
    (_, one, _), (_, two, _) = one_rank, two_nodes
    initial = weights(tiny_model_dir)
    assert one.keys() == two.keys()
    for name, tensor in one.items():
        if name.endswith("k_proj.bias"):  # rounding amplified by AdamW: test_verl_world_size.py says why
            continue
        assert (two[name] - tensor).norm() / tensor.norm() <= RELATIVE, name
        if name.endswith("proj.weight"):
            assert (tensor - initial[name]).norm() / tensor.norm() > 100 * RELATIVE, name


def refused(config: dict) -> tuple[str, float]:
    """The error VerlTrainer stops with, and how long it took; Ray is left as it was (not connected)."""
    started = time.perf_counter()
    with pytest.raises(ValueError) as error:
        VerlTrainer(config_from_dict(config))
    assert not ray.is_initialized()  # left, or never joined: nothing of the trainer's runs
    return " ".join(str(error.value).split()), time.perf_counter() - started


def closed_port() -> int:
    """A port on this machine nothing listens on (bound, then released)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        return held.getsockname()[1]


def test_an_address_that_does_not_answer_stops_the_trainer_before_anything_starts(tiny_model_dir):
    address = f"127.0.0.1:{closed_port()}"
    message, took = refused(on_cluster(tiny_model_dir, address, 2))
    assert message == f"ray_address: no Ray cluster answers at {address} (Connection refused)"
    assert took < 2 * PROBE_TIMEOUT_S  # ray.init itself waits without end (100 s and more, measured)


def test_a_port_that_is_not_a_ray_head_stops_the_trainer(tiny_model_dir):
    with socket.socket() as listener:  # accepts connections (the kernel's backlog), speaks no gRPC
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        message, took = refused(on_cluster(tiny_model_dir, address, 2))
    assert message.startswith(
        f"ray_address: no Ray cluster answers at {address} (the port is open but no gRPC"
    )
    assert took < 3 * PROBE_TIMEOUT_S


def test_ray_address_from_the_environment_is_still_honoured_and_checked(tiny_model_dir, monkeypatch):
    address = f"127.0.0.1:{closed_port()}"
    monkeypatch.setenv("RAY_ADDRESS", address)
    config = settings(tiny_model_dir, backend="verl", world_size=2, verl={"trainer": {"nnodes": 2}})
    message, _ = refused(config)
    assert message == f"RAY_ADDRESS: no Ray cluster answers at {address} (Connection refused)"


def test_a_cluster_without_the_nodes_or_devices_the_ranks_need_stops_the_trainer(tiny_model_dir, cluster):
    address = cluster.address
    message, _ = refused(on_cluster(tiny_model_dir, address, 3))
    assert message.startswith(
        "ray_address: verl.trainer.nnodes=3 nodes of 1 rank on cpu (2 worker groups) need 2 CPUs on each "
        "node; "
        f"the cluster at {address} has 2 live nodes: "
    )
    assert message.count(" with 2 CPUs, 0 GPUs") == 2  # what each node has
    message, _ = refused(on_cluster(tiny_model_dir, address, 2, device="cuda"))
    assert "nnodes=2 nodes of 1 rank on cuda (2 worker groups) need 2 CPUs and 1 GPU on each node" in message


def test_the_setting_needs_the_verl_backend_and_a_host_and_port(tiny_model_dir):
    with pytest.raises(
        ConfigError, match=r"ray_address: a Ray cluster runs verl's workers; it needs `backend: verl`"
    ):
        config_from_dict(settings(tiny_model_dir, ray_address="10.0.0.1:6379"))
    with pytest.raises(ConfigError, match=r"ray_address: expected the head's host:port .* got 'head'"):
        config_from_dict(settings(tiny_model_dir, backend="verl", ray_address="head"))
    # with a cluster named, nnodes above 1 is accepted when read (this machine holds one node's share)
    config = config_from_dict(on_cluster(tiny_model_dir, "ray://10.0.0.1:10001", 4))
    assert config.ray_address == "ray://10.0.0.1:10001"


def test_otel_rl_train_refuses_a_dead_cluster_before_it_starts_anything(tiny_model_dir, tmp_path):
    address = f"127.0.0.1:{closed_port()}"
    output = tmp_path / "run"
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump(on_cluster(tiny_model_dir, address, 2, output_dir=str(output))))
    done = subprocess.run(
        [str(OTEL_RL), "train", "-c", str(config)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"error: ray_address: no Ray cluster answers at {address} (Connection refused)" in " ".join(
        done.stdout.split()
    )
    assert not output.exists()  # no run folder, no trainer process, no server
