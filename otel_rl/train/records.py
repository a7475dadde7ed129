"""What a training run records: its steps (and an online run's evaluations), as lines and as training-step
spans, which the web view's training page and the server's metrics read."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from otel_rl import attributes as attr

if TYPE_CHECKING:
    from otel_rl.transforms.rewards import RewardSpec


@dataclass
class StepRecord:
    """One online step: what it trained on and how long each phase took (an `otel_rl.train.step` span)."""

    step: int
    policy_version: int  # the version this step produced
    group_ids: list[str]
    reward_mean: float
    success_rate: float
    rollouts: int
    samples: int
    sampled_tokens: int
    response_tokens: int
    stale_groups: int  # groups dropped, older than max_staleness
    collect_s: float
    transform_s: float
    train_s: float
    save_s: float
    reload_s: float
    paused_s: float  # how long the gateway held new harness calls for the reload
    drain_s: float  # of which: waiting for the calls in flight to finish before swapping weights
    wall_s: float
    trainer: dict[str, float] = field(default_factory=dict)  # the trainer's metrics (loss, mismatch, ...)
    screened: int = 0  # rollouts of the step's groups left out as flagged by a hack detector (hack_flags)
    # transform_s in parts: waiting for the normalized tables to include the step's commits, reading the
    # step's rows, building its samples
    transform_wait_s: float = 0.0
    transform_read_s: float = 0.0
    transform_build_s: float = 0.0
    # A colocated gateway (`serve --colocated`): how long calls were held while the servers slept for the
    # update (drain, sleep, train, save, wake, reload); None when the servers stay up beside the trainer
    colocated_pause_s: float | None = None
    # A step's batch is collected and built while the step before it trains: what this step still waited
    # for, from its start, its batch (collect and transform) and, of that, the transform
    batch_wait_s: float = 0.0
    transform_waited_s: float = 0.0

    @property
    def pipeline_share(self) -> float:
        """The pipeline's share of the step's wall time: the transform it waited for, save and reload."""
        pipeline = self.transform_waited_s + self.save_s + self.reload_s
        return pipeline / self.wall_s if self.wall_s else 0.0


@dataclass
class EvalRecord:
    """One evaluation: every val task once, at one policy version (also an `otel_rl.train.eval` span)."""

    name: str  # which eval command (eval.harnesses), "eval" for the single eval.harness
    step: int
    policy_version: int
    rollouts: int
    reward_mean: float
    success_rate: float
    wall_s: float


@dataclass
class UpdateRecord:
    """One update of an offline RL or SFT run (an `otel_rl.train.step` span; the online figures absent, the
    mode in the run id: `offline-...`, `sft-...`)."""

    step: int
    policy_version: int  # the checkpoint this update produced: step-N
    train_s: float
    trainer: dict[str, float] = field(default_factory=dict)  # the trainer's metrics (loss, mismatch, ...)


@dataclass
class OnlineResult:
    run_id: str
    steps: list[StepRecord]
    evals: list[EvalRecord]
    wall_s: float


class RunRecorder:
    """Writes step and evaluation records to the store as spans (scope otel_rl.train), over OTLP."""

    def __init__(self, server_url: str, token: str, run_id: str, reward: RewardSpec | None = None) -> None:
        self.run_id = run_id
        # on every span: whichever of them the server keeps last, the run's rollouts show this reward
        self._reward = reward_attributes(reward) if reward else {}
        self._provider = TracerProvider(resource=Resource.create({"service.name": "otel-rl-train"}))
        exporter = OTLPSpanExporter(
            endpoint=f"{server_url.rstrip('/')}/v1/traces", headers={"authorization": f"Bearer {token}"}
        )
        self._provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=200))
        self._tracer = self._provider.get_tracer(attr.TRAIN_SCOPE)

    def start(self) -> None:
        """Tell the server the run has started, and which reward it trains on (an `otel_rl.train.run` span):
        the rollouts view shows the run's rollouts' reward by it before the first step is recorded."""
        attributes = {attr.TRAIN_RUN_ID: self.run_id, **self._reward}
        self._tracer.start_span(attr.TRAIN_RUN_SPAN_NAME, attributes=attributes).end()
        self._provider.force_flush()

    def record(
        self,
        name: str,
        record: StepRecord | EvalRecord | UpdateRecord,
        started_ns: int,
        *,
        flush: bool = True,
    ) -> None:
        """Export one record as a span: at once with `flush` (an online step is slow, and must not be lost
        with a killed loop), else with the next batch (offline updates are quick; close() sends the rest)."""
        values = asdict(record)
        trainer = values.pop("trainer", {})
        attributes: dict[str, Any] = {
            attr.TRAIN_RUN_ID: self.run_id,
            attr.POLICY_VERSION: record.policy_version,
        }
        attributes |= {
            f"{attr.TRAIN_PREFIX}{key}": value
            for key, value in values.items()
            if key != "policy_version" and value is not None  # a span attribute cannot be None
        }
        attributes |= {f"{attr.TRAIN_PREFIX}trainer.{key}": value for key, value in trainer.items()}
        attributes |= self._reward
        self._tracer.start_span(name, attributes=attributes, start_time=started_ns).end()
        if flush:
            self._provider.force_flush()

    def close(self) -> None:
        self._provider.shutdown()


def reward_attributes(spec: RewardSpec) -> dict[str, Any]:
    """A run's reward as its records carry it (transforms/45_reward_specs.sql reads them back)."""
    return {
        attr.TRAIN_REWARD_NAME: spec.name,
        attr.TRAIN_REWARD_RULE: spec.rule,
        attr.TRAIN_REWARD_TRUSTED_SOURCES: list(spec.trusted_sources),
    }


def format_step(record: StepRecord) -> str:
    mismatch = record.trainer.get("mismatch")
    return (
        f"step {record.step:>4}  reward {record.reward_mean:.3f}  success {record.success_rate:6.1%}  "
        f"samples {record.samples}  tokens {record.sampled_tokens}  stale {record.stale_groups}  "
        f"screened {record.screened}  "
        # collect and transform mostly ran during the update before: the step waited `waited` for them
        f"collect {record.collect_s:.2f}s  transform {record.transform_s:.2f}s  "
        f"waited {record.batch_wait_s:.2f}s  train {record.train_s:.2f}s  "
        f"reload {record.reload_s:.2f}s" + (f"  mismatch {mismatch:.2e}" if mismatch is not None else "")
    )


def format_eval(record: EvalRecord) -> str:
    return (
        f"[bold]{record.name} at version {record.policy_version}: success {record.success_rate:.1%}, "
        f"reward {record.reward_mean:.3f} over {record.rollouts} val tasks ({record.wall_s:.1f}s)"
    )
