"""`otel-rl serve --model DIR --replicas N`: N local vLLM servers of one model, each on its own devices,
checked before anything starts, started together and stopped together (the gateway balances and reloads
them as it does any servers in its pool)."""

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from otel_rl.gateway.vllm import CPU_KV_CACHE_GIB, VLLMServer, free_ports
from otel_rl.gateway.vllm_env import vllm_python
from otel_rl.gateway.vllm_flags import ParsedArgs, check_with_vllm, user_args
from otel_rl.gateway.vllm_machine import GIB, Machine, place_replicas, this_machine


class LocalReplicas:
    """The vLLM servers `serve --model` starts (one unless --replicas)."""

    def __init__(
        self,
        model_dir: Path,
        *,
        replicas: int = 1,
        vllm_args: Sequence[str] = (),
        lora_rank: int | None = None,
        max_model_len: int | None = None,
        machine: Machine | None = None,
    ) -> None:
        """Raises ValueError naming the flag at fault: a flag otel-rl sets itself in `vllm_args`, or
        `replicas` the machine cannot hold. vLLM's own parser checks `vllm_args` in `check_args`."""
        self.machine = machine or this_machine()
        self.passed = user_args(vllm_args)
        self.replicas = replicas
        device = "cuda" if self.machine.gpus else "cpu"
        ports = free_ports(replicas)
        self.servers = [
            VLLMServer(
                model_dir,
                port=port,
                lora_rank=lora_rank,
                max_model_len=max_model_len,
                vllm_args=self.passed,
                device=device,
            )
            for port in ports
        ]
        self.place(ParsedArgs())

    def place(self, parsed: ParsedArgs) -> None:
        """Give each server its devices, for servers of `parsed.ranks` ranks each."""
        weights = sum(f.stat().st_size for f in self.servers[0].model_dir.glob("*.safetensors"))
        placements = place_replicas(
            self.machine,
            self.replicas,
            ranks=parsed.ranks,
            kv_cache_bytes=CPU_KV_CACHE_GIB * GIB,
            weight_bytes=weights,
        )
        for server, placement in zip(self.servers, placements, strict=True):
            server.placement = placement

    def check_args(self) -> None:
        """Let vLLM's own parser judge the flags passed through (nothing starts; seconds to import vLLM), and
        place the servers again for the parallel sizes they ask for. Raises ValueError naming the flag."""
        if not self.passed:
            return  # otel-rl's own flags only: known to parse
        first = self.servers[0]
        self.place(check_with_vllm(vllm_python(first.device), first.arguments(), self.passed))

    @property
    def urls(self) -> tuple[str, ...]:
        return tuple(server.url for server in self.servers)

    def start(self) -> None:
        """Start every server at once (each waits for its own health and warm-up); if one fails, stop all
        and raise its error."""
        with ThreadPoolExecutor(max_workers=len(self.servers)) as pool:
            starts = [pool.submit(server.start) for server in self.servers]
        failures = [error for start in starts if (error := start.exception()) is not None]
        if failures:
            self.stop()
            raise failures[0]

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
