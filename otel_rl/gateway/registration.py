"""Inference servers registered at runtime: verl launches its vLLM replicas after the gateway has started.

A server joins the pool only if it serves the current policy's weights (vLLM's weight checksums), so that
every call still runs under the version its span names. It leaves at once; its calls in flight finish.
Neither happens while a reload runs: the servers a reload switches are the ones it paused.
"""

from otel_rl.gateway.client import UpstreamClient, UpstreamError
from otel_rl.gateway.reload import ReloadCoordinator
from otel_rl.gateway.servers import InferenceServer, ServerPool, weight_checksums
from otel_rl.gateway.settings import server_root

# Far more replicas than any one trainer runs; the bound keeps a runaway registrar from growing the pool
# (every call's routing and every reload visit each server).
MAX_SERVERS = 256


class RegistrationRefused(RuntimeError):
    """The server cannot join or leave now, or serves other weights than the policy's (HTTP 409)."""


class ServerNotRegistered(LookupError):
    """No server with this URL is in the pool (HTTP 404)."""


class ServerUnreachable(RuntimeError):
    """The server did not answer as a vLLM server in dev mode does (HTTP 502)."""


async def register(
    pool: ServerPool, coordinator: ReloadCoordinator, client: UpstreamClient, url: str, *, timeout_s: float
) -> InferenceServer:
    """Add the server at `url` (or bring a taken-out one back) once its weights equal the policy's."""
    root = server_root(url, given_as="url")
    _refuse_while_busy(coordinator)
    if coordinator.policy.lora_adapter is not None:
        raise RegistrationRefused("the policy is a LoRA adapter: servers register while it is a checkpoint")
    known = pool.find(root)
    if known is not None and known.available:
        return known
    if known is None and len(pool.servers) >= MAX_SERVERS:
        raise RegistrationRefused(f"the pool already holds {MAX_SERVERS} servers, the most it takes")
    checksums = await _weights(client, root, timeout_s)
    reference = pool.reference_checksums
    if reference is None:  # no reload yet: the servers in the pool hold the policy's weights
        live = [server for server in pool.servers if server.available and server is not known]
        reference = await _weights(client, live[0].url, timeout_s) if live else checksums
    if checksums != reference:
        raise RegistrationRefused(
            f"{root} serves other weights than the policy's (version {coordinator.policy.version}): register "
            "a server holding the policy's weights, or register it before the next weight update"
        )
    _refuse_while_busy(coordinator)  # a reload may have begun while the weights were read
    pool.reference_checksums = reference
    if known is None:
        return pool.add(root)
    known.out_reason, known.healthy, known.failure = None, True, None
    known.consecutive_connect_failures = 0
    return known


def deregister(pool: ServerPool, coordinator: ReloadCoordinator, url: str) -> InferenceServer:
    """Take the server at `url` out of the pool for good."""
    root = server_root(url, given_as="url")
    server = pool.find(root)
    if server is None:
        raise ServerNotRegistered(f"no inference server {root} is in the pool")
    _refuse_while_busy(coordinator)
    pool.remove(server)
    return server


def _refuse_while_busy(coordinator: ReloadCoordinator) -> None:
    if coordinator.busy:
        raise RegistrationRefused("a weight reload is running: change the servers after it ends")


async def _weights(client: UpstreamClient, url: str, timeout_s: float) -> dict[str, str]:
    """The server's weight checksums, after checking that it is a healthy vLLM server in dev mode."""
    try:
        status, _ = await client.request("GET", f"{url}/health", timeout_s=timeout_s)
        if status != 200:
            raise ServerUnreachable(f"{url}: GET /health answered HTTP {status}")
        return await weight_checksums(client, url, timeout_s)
    except UpstreamError as error:
        raise ServerUnreachable(f"{url}: {error}") from None
    except ValueError as error:
        if "HTTP 404" in str(error):
            raise ServerUnreachable(
                f"{url} serves no /weight_checker: start its vLLM with VLLM_SERVER_DEV_MODE=1"
            ) from None
        raise ServerUnreachable(f"{url}: {error}") from None
    except (KeyError, TypeError) as error:
        raise ServerUnreachable(f"{url}: /weight_checker answered without checksums ({error!r})") from None
