"""The server's settings objects (pydantic models): a value they cannot use is refused naming the setting, and
`otel-rl serve` refuses it naming the flag, before the store file is made."""

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from otel_rl.archive_api import ScheduleSettings
from otel_rl.cli import app
from otel_rl.coding.sandbox import Limits
from otel_rl.connections import ConnectionLimits
from otel_rl.query_api import QueryLimits
from otel_rl.server import ServeSettings


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--upstream-timeout", "0"], "--upstream-timeout: Input should be greater than 0"),
        (["--drain-timeout", "-1"], "--drain-timeout: Input should be greater than or equal to 0"),
        (["--http-port", "70000"], "--http-port: Input should be less than or equal to 65535"),
        (["--retain-bytes", "lots"], "--retain-bytes: 'lots' is not a size"),
        (["--retain-bytes", "2000T"], "--retain-bytes: '2000T': a size between 1 byte and 1 PiB"),
        (
            ["--archive-after-days", "40000"],
            "--archive-after-days: Input should be less than or equal to 36500",
        ),
        (["--archive-after-days", "30000"], "archive finished days, between 1970-01-02 and today"),
    ],
)
def test_serve_refuses_a_setting_it_cannot_use_naming_the_flag_before_the_store_opens(
    tmp_path, flags, message
) -> None:
    db = tmp_path / "store.duckdb"

    result = CliRunner().invoke(app, ["serve", "--db", str(db), "--token", "t", *flags])

    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.replace("│", " ").split())
    assert not db.exists()


@pytest.mark.parametrize(
    ("settings", "values", "field"),
    [
        (ServeSettings, {"query_concurrency": 0}, "query_concurrency"),
        (ServeSettings, {"grpc_port": -1}, "grpc_port"),
        (ServeSettings, {"replicas": 0}, "replicas"),
        (ServeSettings, {"no_such_setting": 1}, "no_such_setting"),
        (QueryLimits, {"timeout_s": 0}, "timeout_s"),
        (QueryLimits, {"max_concurrent": 0}, "max_concurrent"),
        (ConnectionLimits, {"max_header_bytes": 0}, "max_header_bytes"),
        (ConnectionLimits, {"body_timeout_s": -1.0}, "body_timeout_s"),
        (ScheduleSettings, {"retain_days": 36_501}, "retain_days"),
        (Limits, {"cpu_seconds": 0}, "cpu_seconds"),
        (Limits, {"wall_seconds": 0}, "wall_seconds"),
        (Limits, {"file_bytes": -1}, "file_bytes"),
    ],
)
def test_a_settings_object_refuses_a_value_it_cannot_use_naming_the_setting(settings, values, field) -> None:
    with pytest.raises(ValidationError) as refused:
        settings(**values)

    assert [problem["loc"] for problem in refused.value.errors()] == [(field,)]


def test_a_schedule_of_no_step_is_refused_and_no_flag_means_no_schedule() -> None:
    with pytest.raises(ValidationError, match="nothing to do"):
        ScheduleSettings()

    assert ScheduleSettings.from_flags(None, None, None) is None
    schedule = ScheduleSettings.from_flags(1, None, "2KiB")
    assert schedule == ScheduleSettings(archive_after_days=1, retain_bytes=2048)


def test_frozen_settings_stay_as_made() -> None:
    for frozen in (QueryLimits(), ConnectionLimits(), Limits(), ScheduleSettings(retain_days=1)):
        field = next(iter(type(frozen).model_fields))
        with pytest.raises(ValidationError, match="frozen"):
            setattr(frozen, field, 1)
