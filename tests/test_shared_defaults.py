"""A default two commands share has one definition: the controller's limits and the training
configuration's `online` section, and the two pages that document them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from otel_rl.controller import defaults
from otel_rl.controller.local import ControllerSettings
from otel_rl.train.config import config_from_dict
from otel_rl.train.controllers import train_settings

DOCS = Path(__file__).resolve().parents[1] / "docs"
SHARED = {
    "concurrency": defaults.CONCURRENCY,
    "timeout_s": defaults.TIMEOUT_S,
    "max_attempts": defaults.MAX_ATTEMPTS,
}


def test_the_controller_and_a_training_configuration_default_to_the_same_limits() -> None:
    controller = ControllerSettings(command=["agent"])
    online = config_from_dict({"model": "m", "online": {"harness": ["agent"]}}).online
    for name, value in SHARED.items():
        assert getattr(controller, name) == getattr(online, name) == value, name
    trained = train_settings(config_from_dict({"model": "m", "online": {"harness": ["agent"]}}))
    assert {name: getattr(trained, name) for name in SHARED} == SHARED


@pytest.mark.parametrize("page", ["controller.md", "training.md"])
def test_the_pages_give_the_defaults_the_code_has(page: str) -> None:
    text = (DOCS / page).read_text()
    for name, value in SHARED.items():
        documented = re.findall(rf"^\| `{name}` \| ([^|]+) \|", text, re.MULTILINE)
        assert documented, f"{page} has no row for {name}"
        assert {float(cell.split()[0]) for cell in documented} == {value}, (page, name, documented)
