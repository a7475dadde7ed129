"""The stand-in kubelet's container runtime for image behaviour `run` (tests/kube_api.py): a pod's first
container executed as a local process, with the argv, environment and Secret volumes the pod spec gives it.

As a kubelet would: the environment is the container's `env` (Secret references resolved) over the image's
PATH; it runs as the securityContext's runAsUser/runAsGroup with no capabilities (setpriv); each Secret
volume's items are written as files; the terminationMessagePath is a file whose content (at most 4096
bytes) becomes the terminated state's `message`; stdout and stderr together are the log. A
process here cannot mount at the pod's paths, so each mount path (and the termination message path) is a
folder of its own under a temporary one, and the argv's mentions of those paths are pointed there.
"""

import base64
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

IMAGE_PATH = "/usr/local/bin:/usr/bin:/bin"
MAX_MESSAGE_BYTES = 4096  # what the kubelet keeps of a termination message


class LocalContainer:
    """One pod's harness container, running."""

    def __init__(self, pod: dict[str, Any], env: dict[str, str], secrets: dict[str, dict[str, Any]]) -> None:
        spec = pod["spec"]
        container = spec["containers"][0]
        self.root = Path(tempfile.mkdtemp(prefix="kube-run-"))
        volumes = {volume["name"]: volume for volume in spec.get("volumes") or []}
        paths: dict[str, str] = {}
        for mount in container.get("volumeMounts") or []:
            folder = self.root / mount["mountPath"].strip("/")
            folder.mkdir(parents=True)
            source = volumes[mount["name"]].get("secret")
            if source is not None:
                data = secrets[source["secretName"]].get("data") or {}
                for item in source.get("items") or [{"key": key, "path": key} for key in data]:
                    (folder / item["path"]).write_bytes(base64.b64decode(data[item["key"]]))
            paths[mount["mountPath"]] = str(folder)
        message = container.get("terminationMessagePath", "/dev/termination-log")
        self.message_file = self.root / "termination" / Path(message).name
        self.message_file.parent.mkdir()
        self.message_file.touch()
        paths[message] = str(self.message_file)
        argv = [_pointed(arg, paths) for arg in [*container["command"], *(container.get("args") or [])]]
        context = {**(spec.get("securityContext") or {}), **(container.get("securityContext") or {})}
        if "runAsUser" in context:
            uid, gid = context["runAsUser"], context.get("runAsGroup", context["runAsUser"])
            self.root.chmod(0o755)
            os.chown(self.message_file, uid, gid)
            identity = [f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--inh-caps=-all"]
            argv = [shutil.which("setpriv") or "setpriv", *identity, "--bounding-set=-all", "--", *argv]
        self.log_file = self.root / "log"
        with self.log_file.open("wb") as log:
            self.process = subprocess.Popen(
                argv, env={"PATH": IMAGE_PATH, **env}, cwd=self.root, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def exit_code(self) -> int | None:
        return self.process.poll()

    def message(self) -> str:
        return self.message_file.read_bytes()[:MAX_MESSAGE_BYTES].decode(errors="replace")

    def log(self, tail_lines: int | None, limit_bytes: int | None) -> str:
        text = self.log_file.read_bytes().decode(errors="replace")
        if tail_lines is not None:
            text = "".join(text.splitlines(keepends=True)[-tail_lines:])
        return text[:limit_bytes] if limit_bytes is not None else text

    def stop(self) -> None:
        """Kill what is left (a deleted pod) and remove the folders."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def _pointed(arg: str, paths: dict[str, str]) -> str:
    for pod_path, local in sorted(paths.items(), key=lambda item: -len(item[0])):
        arg = arg.replace(pod_path, local)
    return arg
