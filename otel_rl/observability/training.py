"""Training metrics for Prometheus, from the step and evaluation spans an online run sends to the server.

The trainer records each step and evaluation as a span (otel_rl.train.records.RunRecorder); the collector
hands each stored batch of spans here. One gateway serves one policy, so one run trains against a server at
a time: the metrics carry no run id (each run would be a new series forever).
"""

from collections.abc import Iterator

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client import Counter, Gauge
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from otel_rl import attributes as attr
from otel_rl.store.layout import VOUCHED_SENDERS

# A step's phases (StepRecord <phase>_s): collect and transform run during the update before it, and
# batch_wait (of which transform_waited) is what the step still waited for them
STEP_PHASES = ("collect", "transform", "train", "save", "reload", "batch_wait", "transform_waited")
TRANSFORM_PARTS = ("wait", "read", "build")  # the transform phase's time, in order (StepRecord transform_*_s)
# Eval names come from the run's config (eval.harnesses): a handful. More would be a mistake, not a need.
MAX_EVAL_NAMES = 16
OTHER_EVAL = "other"


class TrainingMetrics(Collector):
    """The last step's and evaluation's values as gauges, and totals over the steps received."""

    def __init__(self) -> None:
        self.step = Gauge("otel_rl_train_step", "Number of the last step received.", registry=None)
        self.policy_version = Gauge(
            "otel_rl_train_policy_version", "Policy version the last step produced.", registry=None
        )
        self.last_step_time = Gauge(
            "otel_rl_train_last_step_timestamp_seconds",
            "When the last step record reached the server (Unix time).",
            registry=None,
        )
        self.steps = Counter("otel_rl_train_steps", "Step records received.", registry=None)
        self.reward = Gauge(
            "otel_rl_train_reward_mean",
            "Mean reward of the last step's rollouts (split train) or of the last evaluation (split val).",
            ["split", "eval"],
            registry=None,
        )
        self.success = Gauge(
            "otel_rl_train_success_ratio",
            "Share of rollouts with reward >= 1, as for otel_rl_train_reward_mean.",
            ["split", "eval"],
            registry=None,
        )
        self.mismatch = Gauge(
            "otel_rl_train_mismatch",
            "Mean |trainer logprob - vLLM's recorded logprob| over the last step's sampled tokens.",
            registry=None,
        )
        self.loss = Gauge("otel_rl_train_loss", "The last step's objective.", registry=None)
        self.phase_seconds = Gauge(
            "otel_rl_train_step_phase_seconds",
            "Time of each phase of the last step (collect, transform, train, save, reload; batch_wait: what"
            " the step waited for its batch, collected and built during the update before it, and"
            " transform_waited: the part of that the transform was).",
            ["phase"],
            registry=None,
        )
        self.transform_seconds = Gauge(
            "otel_rl_train_step_transform_seconds",
            "The last step's transform phase in parts: waiting for the normalized tables to include its"
            " commits (wait), reading its rows (read), building its samples (build).",
            ["phase"],
            registry=None,
        )
        self.wall_seconds = Gauge(
            "otel_rl_train_step_wall_seconds", "Wall time of the last step.", registry=None
        )
        self.paused_seconds = Counter(
            "otel_rl_train_harness_paused_seconds",
            "Time harness calls were held by the steps' reloads.",
            registry=None,
        )
        self.stale_groups = Counter(
            "otel_rl_train_stale_groups",
            "Groups dropped as older than max_staleness (samples too stale to train on).",
            registry=None,
        )
        self.screened = Counter(
            "otel_rl_train_screened_rollouts",
            "Rollouts left out of the steps' batches as flagged by a hack detector (the hack_flags view).",
            registry=None,
        )
        self.samples = Counter("otel_rl_train_samples", "Samples the steps trained on.", registry=None)
        self.sampled_tokens = Counter(
            "otel_rl_train_sampled_tokens", "Policy-sampled tokens the steps trained on.", registry=None
        )
        self._evals: set[str] = set()
        self._set_once: set[int] = set()  # ids of the gauges set: the others are not exported (not 0)

    def observe_spans(self, spans: pa.Table) -> None:
        """Take the training records among a stored batch of spans (cheap when, as usual, there are none)."""
        if not spans.num_rows:
            return
        # the trainer's scope from a sender the server vouches for: a rollout key's spans are no steps
        mine = spans.filter(
            pc.and_(
                pc.equal(spans.column("scope_name"), attr.TRAIN_SCOPE),
                pc.is_in(spans.column("sender"), pa.array(VOUCHED_SENDERS)),
            )
        )
        for name, attributes, received in zip(
            mine.column("name").to_pylist(),
            mine.column("attributes").to_pylist(),
            mine.column("received_at").to_pylist(),
            strict=True,
        ):
            values = orjson.loads(attributes or "{}")
            if name == attr.TRAIN_STEP_SPAN_NAME:
                self._step(values, received.timestamp())
            elif name == attr.TRAIN_EVAL_SPAN_NAME:
                self._eval(values)

    def _step(self, values: dict, received_s: float) -> None:
        def number(key: str) -> float | None:
            return _number(values.get(attr.TRAIN_PREFIX + key))

        self.steps.inc()
        self._set(self.last_step_time, received_s)
        for gauge, key in (
            (self.step, "step"),
            (self.wall_seconds, "wall_s"),
            (self.loss, "trainer.loss"),
            (self.mismatch, "trainer.mismatch"),
        ):
            self._set(gauge, number(key))
        self._set(self.policy_version, _number(values.get(attr.POLICY_VERSION)))
        self._set(self.reward.labels("train", ""), number("reward_mean"))
        self._set(self.success.labels("train", ""), number("success_rate"))
        for phase in STEP_PHASES:
            self._set(self.phase_seconds.labels(phase), number(f"{phase}_s"))
        for part in TRANSFORM_PARTS:
            self._set(self.transform_seconds.labels(part), number(f"transform_{part}_s"))
        for counter, key in (
            (self.paused_seconds, "paused_s"),
            (self.stale_groups, "stale_groups"),
            (self.screened, "screened"),
            (self.samples, "samples"),
            (self.sampled_tokens, "sampled_tokens"),
        ):
            value = number(key)
            if value is not None and value >= 0:
                counter.inc(value)

    def _eval(self, values: dict) -> None:
        name = str(values.get(attr.TRAIN_PREFIX + "name", "eval"))
        if name not in self._evals:
            if len(self._evals) >= MAX_EVAL_NAMES:
                name = OTHER_EVAL
            else:
                self._evals.add(name)
        self._set(self.reward.labels("val", name), _number(values.get(attr.TRAIN_PREFIX + "reward_mean")))
        self._set(self.success.labels("val", name), _number(values.get(attr.TRAIN_PREFIX + "success_rate")))

    def _set(self, gauge: Gauge, value: float | None) -> None:
        if value is not None:
            gauge.set(value)
            self._set_once.add(id(gauge))

    def collect(self) -> Iterator[Metric]:
        gauges = (
            self.step,
            self.policy_version,
            self.last_step_time,
            self.mismatch,
            self.loss,
            self.wall_seconds,
        )
        for gauge in gauges:
            if id(gauge) in self._set_once:  # a gauge never set has no value: 0 would be a lie
                yield from gauge.collect()
        for metric in (
            self.reward,  # labelled: only the label values set are exported
            self.success,
            self.phase_seconds,
            self.transform_seconds,
            self.steps,
            self.paused_seconds,
            self.stale_groups,
            self.screened,
            self.samples,
            self.sampled_tokens,
        ):
            yield from metric.collect()


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
