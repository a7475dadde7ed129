"""verl's actor/reference worker, with the one thing a CPU worker must do first.

verl's TrainingWorker opens the process group with `cpu:gloo,<device>:<collective backend>`; when the
device is the CPU that reads "cpu:gloo,cpu:gloo", which torch refuses ("Duplicate device type cpu"). verl's
own function takes the backend as an argument and does nothing when a group is already open, so this
subclass opens it with plain gloo before verl's init_model runs. Everything else is verl's worker as is.
"""

from verl.single_controller.base.decorator import Dispatch, register
from verl.utils.device import get_device_name
from verl.utils.distributed import initialize_global_process_group_ray
from verl.workers.engine_workers import ActorRolloutRefWorker


class ActorRefWorker(ActorRolloutRefWorker):
    """ActorRolloutRefWorker in role "actor" or "ref"; on CPU its process group is gloo's alone."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        if get_device_name() == "cpu":
            initialize_global_process_group_ray(backend="gloo")
        super().init_model()
