"""A harness installs light: the project's wheel without extras, in an environment of its own, has the SDK and
none of the server's or trainer's packages; an agent instrumented from it lands in a real server's store; its
`otel-rl` names the extra each heavier sub-command needs. And requirements.lock is the `[all,dev]` install."""

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_vllm import CalcReplies, FakeVLLM
from otel_rl_server import ServerProcess
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from otel_rl.gateway.vllm_env import cache_root

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"
CALC_AGENT = ROOT / "examples" / "calc_agent.py"
# What a harness must not get with otel-rl (by module name): the server's and the trainer's packages.
HEAVY = ("duckdb", "polars", "pyarrow", "fastapi", "uvicorn", "torch", "verl", "transformers", "numpy")
# The build backend (pyproject.toml's [build-system]), in a cached environment: offline after the first build.
BUILD_REQUIREMENTS = [
    "hatchling==1.33.0",
    "packaging==26.4",
    "pathspec==1.1.1",
    "pluggy==1.7.0",
    "tomlkit==0.15.2",
    "trove-classifiers==2026.9.21.13",
]
AGENT_REQUIREMENTS = ["openai"]  # the agent's own package (examples/calc_agent.py), at the lock's version
READY = ".otel-rl-ready"
TASK = {"id": "add-37-48", "split": "train", "question": "What is 37 + 48?", "a": 37, "op": "+", "b": 48,
        "answer": 85}  # fmt: skip


def run_ok(args: list[str | Path], **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600, **kwargs)
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


def cached_environment(name: str, requirements: list[str], constraints: Path | None = None) -> Path:
    """A virtual environment holding `requirements` (pinned by `constraints`), built once under the cache and
    named by the hash of what it holds. A venv cannot move once built (its scripts name their interpreter's
    path), so it is built in place under a lock and used only once its ready marker is written."""
    recipe = "\n".join([sys.version, *requirements, constraints.read_text() if constraints else ""])
    env = cache_root() / f"{name}-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"
    env.parent.mkdir(parents=True, exist_ok=True)
    with env.with_name(env.name + ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (env / READY).is_file():
            shutil.rmtree(env, ignore_errors=True)  # what an interrupted build left
            run_ok([sys.executable, "-m", "venv", env])
            pip = [env / "bin" / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
            run_ok([*pip, *(["-c", constraints] if constraints else []), *requirements])
            (env / READY).write_text(recipe)
    return env


def base_requirements() -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]


@pytest.fixture(scope="module")
def light_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The interpreter of an environment with `pip install otel-rl` (the base requirements from PyPI at the
    lock's versions, the agent's openai) and this checkout's wheel, reinstalled on every run."""
    build = cached_environment("build-hatchling", BUILD_REQUIREMENTS) / "bin" / "python"
    wheels = tmp_path_factory.mktemp("wheel")
    run_ok([build, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", wheels, ROOT])
    [wheel] = wheels.glob("otel_rl-*.whl")
    python = cached_environment("light", [*base_requirements(), *AGENT_REQUIREMENTS], LOCK) / "bin" / "python"
    run_ok([python, "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall", wheel])
    run_ok([python, "-m", "pip", "check"])  # the wheel's own requirements are what the environment has
    found = in_environment(
        python,
        "import importlib.util, json; "
        f"print(json.dumps([m for m in {list(HEAVY)!r} if importlib.util.find_spec(m) is not None]))",
    )
    assert found == [], f"`pip install otel-rl` installs {found}"
    return python


# Prints an environment's packages and bytes (links not followed: a venv's python links to the system's).
SIZE = (
    "import json, os, sys, importlib.metadata as m; "
    "print(json.dumps([len(list(m.distributions())), sum(os.path.getsize(os.path.join(d, f)) "
    "for d, _, fs in os.walk(sys.prefix) for f in fs if not os.path.islink(os.path.join(d, f)))]))"
)


def in_environment(python: Path, code: str) -> object:
    """Run `code` (which prints one JSON value) in the environment of `python`, outside the checkout."""
    return json.loads(run_ok([python, "-c", code], cwd=python.parent).stdout)


def test_the_base_install_has_the_sdk_and_nothing_heavier(light_python: Path):
    # nothing heavier: the fixture checked that none of HEAVY is there
    imported = in_environment(
        light_python,
        "import json, sys, otel_rl, otel_rl.sdk; "
        "assert (otel_rl.instrument, otel_rl.rollout, otel_rl.reward) == "
        "(otel_rl.sdk.instrument, otel_rl.sdk.rollout, otel_rl.sdk.reward); "
        "print(json.dumps([otel_rl.__file__, sorted({m.split('.')[0] for m in sys.modules})]))",
    )
    assert not imported[0].startswith(str(ROOT)), "the environment imported the checkout, not the wheel"
    assert "opentelemetry" in imported[1]

    light, full = (
        in_environment(python, SIZE)
        for python in (light_python, Path(sys.prefix) / "bin" / "python")  # this one: the full [all,dev]
    )
    print(f"\nbase install: {light[0]} packages, {light[1] / 2**20:.0f} MiB; ", end="")
    print(f"the full environment: {full[0]} packages, {full[1] / 2**20:.0f} MiB")
    assert light[0] < 60 and light[1] < 200 * 2**20, (
        f"the base install grew: {light[0]} packages, {light[1]} B"
    )


def test_an_agent_instrumented_from_the_base_install_lands_in_the_store(light_python: Path, tmp_path: Path):
    with FakeVLLM() as fake:
        fake.script(CalcReplies())
        server = ServerProcess(tmp_path / "store.duckdb", tmp_path, flags=("--vllm", fake.base_url)).start()
        try:
            env = {
                key: value for key, value in os.environ.items() if not key.startswith(("OTEL_", "OPENAI_"))
            }
            env |= {
                "OTEL_EXPORTER_OTLP_ENDPOINT": server.http_url,
                "OTEL_RL_TOKEN": server.token,
                "OPENAI_BASE_URL": f"{server.http_url}/v1",  # through the gateway: exact token ids
                "OPENAI_API_KEY": server.token,
                "OTEL_SERVICE_NAME": "light-agent",
            }
            done = run_ok([light_python, CALC_AGENT, "--task-json", json.dumps(TASK)], env=env, cwd=tmp_path)
            result = json.loads(done.stdout)
            assert result["reward"] == 1.0
            rollout_id = result["rollout_id"]
            [rollout] = server.sql(
                "SELECT status, n_calls, service_name, task_id FROM rollouts "
                f"WHERE rollout_id = '{rollout_id}'"
            ).to_pylist()
            assert rollout == {
                "status": "ok",
                "n_calls": 2,
                "service_name": "light-agent",
                "task_id": "add-37-48",
            }
            calls = server.sql(
                "SELECT dialect, len(prompt_token_ids) > 0 AS has_ids, output_messages FROM llm_calls "
                f"WHERE rollout_id = '{rollout_id}' ORDER BY start_time_unix_nano"
            ).to_pylist()
            assert [(c["dialect"], c["has_ids"]) for c in calls] == [("gateway", True), ("gateway", True)]
            assert "The answer is 85." in calls[1]["output_messages"]
            # the harness's own spans, made by the base install's SDK and OpenAI instrumentation
            scopes = server.sql(
                "SELECT DISTINCT scope_name FROM spans "
                f"WHERE attributes ->> 'otel_rl.rollout.id' = '{rollout_id}' "
                "AND resource_attributes ->> 'service.name' = 'light-agent' ORDER BY 1"
            ).column(0)
            assert {"otel_rl.sdk", "opentelemetry.instrumentation.openai.v1"} <= set(scopes.to_pylist())
            rewards = server.sql(
                f"SELECT level, value, source FROM rewards WHERE rollout_id = '{rollout_id}'"
            ).to_pylist()
            assert rewards == [{"level": "outcome", "value": 1.0, "source": "harness"}]
        finally:
            server.stop()


@pytest.mark.parametrize(
    ("command", "extra"),
    [(["serve", "--db", "x.duckdb"], "server"), (["export", "samples", "-o", "x"], "server"),
     (["train", "--config", "x.yaml"], "train"), (["demo", "--help"], "all")],
)  # fmt: skip
def test_the_base_install_cli_names_the_extra_a_sub_command_needs(light_python: Path, command, extra):
    otel_rl = light_python.parent / "otel-rl"
    done = subprocess.run(
        [otel_rl, *command], capture_output=True, text=True, timeout=60, cwd=light_python.parent
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"otel-rl {command[0]} needs the {extra} extra: pip install 'otel-rl[{extra}]'" in done.stderr
    listing = run_ok([otel_rl, "--help"]).stdout
    assert "serve" in listing and "pip install 'otel-rl[server]'" in listing


def test_the_base_install_says_which_extra_the_transforms_need(light_python: Path):
    done = subprocess.run(
        [light_python, "-c", "from otel_rl.transforms import build_samples"],
        capture_output=True, text=True, timeout=60, cwd=light_python.parent,
    )  # fmt: skip
    assert done.returncode == 1
    assert "otel_rl.transforms.build_samples needs 'polars', which this install lacks" in done.stderr
    assert "pip install 'otel-rl[server]'" in done.stderr


def locked_versions() -> dict[str, str]:
    pins = (
        line.split("==")
        for line in LOCK.read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    return {canonicalize_name(name): version.strip() for name, version in pins}


def requirements_of(extras: Iterator[str] | list[str], project: dict) -> list[Requirement]:
    """The requirements of the project with these extras: the base ones, each extra's, nested extras'."""
    found = [Requirement(text) for text in project["dependencies"]]
    for extra in extras:
        for requirement in map(Requirement, project["optional-dependencies"][extra]):
            if canonicalize_name(requirement.name) == canonicalize_name(project["name"]):
                found += requirements_of(sorted(requirement.extras), project)
            else:
                found.append(requirement)
    return found


def test_the_lock_is_the_all_and_dev_install_and_keeps_its_versions():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    locked = locked_versions()
    wrong = [
        f"{requirement} (locked: {locked.get(canonicalize_name(requirement.name))})"
        for requirement in requirements_of(["all", "dev"], project)
        if canonicalize_name(requirement.name) not in locked
        or not requirement.specifier.contains(locked[canonicalize_name(requirement.name)], prereleases=True)
    ]
    assert wrong == []
    # the trainer's exact pins stay where they were measured
    assert (locked["torch"], locked["verl"]) == ("2.13.0+cpu", "0.9.1")
    assert not {"torch", "verl", "duckdb"} & {canonicalize_name(r.name) for r in requirements_of([], project)}
