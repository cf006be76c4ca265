"""scripts/gpu-env.sh, which every GPU runner sources, without a GPU: stand-ins for nvidia-smi (four GPUs) and
nvidia-cuda-mps-control (it records the CUDA_VISIBLE_DEVICES it was started with) on PATH. What is checked is
the runners' own logic: how many GPUs they count and which numbering MPS clients get."""

from __future__ import annotations

import os
import stat
import subprocess
from typing import Any, Dict

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

# Sources gpu-env.sh, counts the GPUs, starts and stops MPS, and prints what a client would see at each step.
SCRIPT = """
source scripts/gpu-env.sh
require_gpus label shared
echo "n_gpus=$n_gpus"
mps_start label
echo "mps_on=$mps_on"
echo "clients=${CUDA_VISIBLE_DEVICES-unset}"
mps_recover
echo "recovered=${CUDA_VISIBLE_DEVICES-unset}"
mps_stop
echo "stopped=${CUDA_VISIBLE_DEVICES-unset}"
"""


def _run(tmp_path: Any, visible: str | None) -> Dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    record = tmp_path / "daemon-env"
    stand_ins = {
        "nvidia-smi": "#!/bin/sh\nfor i in 0 1 2 3; do echo \"GPU $i: stand-in (UUID: GPU-$i)\"; done\n",
        # `-d` starts the daemon (recorded with the GPUs it was given); `quit` on stdin stops it.
        "nvidia-cuda-mps-control": f"#!/bin/sh\nif [ \"$1\" = -d ]; then echo \"${{CUDA_VISIBLE_DEVICES-unset}}\""
                                   f" >> {record}; fi\nexit 0\n",
        "pgrep": "#!/bin/sh\nexit 1\n",
    }
    for name, text in stand_ins.items():
        f = bin_dir / name
        f.write_text(text)
        f.chmod(f.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ)
    env.update(PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", TMPDIR=str(tmp_path))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.pop("CUDA_MPS_PIPE_DIRECTORY", None)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    r = subprocess.run(["bash", "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    out: Dict[str, str] = {}
    for line in r.stdout.splitlines():
        k, _, v = line.partition("=")
        if k in ("n_gpus", "mps_on", "clients", "recovered", "stopped"):
            out[k] = v
    out["daemon"] = ",".join(record.read_text().split()) if record.exists() else ""
    return out


def test_a_subset_of_the_gpus_is_counted_and_mps_clients_get_the_servers_numbering(tmp_path: Any) -> None:
    out = _run(tmp_path, "2,3")
    # Two GPUs to the runners, not nvidia-smi's four.
    assert out["n_gpus"] == "2", out
    # The daemon (started twice: once more by mps_recover) keeps the caller's GPUs; its clients count from 0.
    assert out["daemon"] == "2,3,2,3", out
    assert out["mps_on"] == "1" and out["clients"] == "0,1", out
    assert out["recovered"] == "0,1", out
    # Back to the caller's list once MPS is stopped.
    assert out["stopped"] == "2,3", out


def test_gpus_named_by_uuid_get_the_servers_numbering_too(tmp_path: Any) -> None:
    out = _run(tmp_path, "GPU-2,GPU-3,GPU-1")
    assert out["n_gpus"] == "3", out
    assert out["clients"] == "0,1,2", out
    assert out["stopped"] == "GPU-2,GPU-3,GPU-1", out


def test_without_a_list_every_gpu_counts_and_nothing_is_renumbered(tmp_path: Any) -> None:
    out = _run(tmp_path, None)
    assert out["n_gpus"] == "4", out
    assert out["daemon"] == "unset,unset", out
    assert out["clients"] == "unset" and out["stopped"] == "unset", out
