"""ni_hf.training.publishing: what an upload sends (checkpoints stay local), the message when it cannot, and the
command a run records: the launcher's own command line with all its flags, and a warning with the working commands
when a launcher started fewer processes than it was asked for (`accelerate launch --cpu --num_processes 2`)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import huggingface_hub
import pytest
from huggingface_hub.errors import OfflineModeIsEnabled
from huggingface_hub.utils import filter_repo_objects

import ni_hf.training.publishing
from ni_hf.training.publishing import (
    UPLOAD_IGNORE_PATTERNS,
    Launch,
    check_push,
    explain_push_failure,
    hub_repo_id,
    push_folder,
    push_run,
    reconstruct_command,
    warn_if_fewer_processes,
)

RUN_FILES = [
    "README.md",
    "fuzzy_boolean_results.json",
    "modeling_neural_interpreter.py",
    "pretrain/model.safetensors",
    "pretrain/checkpoint-512/model.safetensors",
    "pretrain/checkpoint-512/optimizer.pt",
    "adapt-all/config.json",
    "checkpoint-690/trainer_state.json",
    "_scratch/notes.txt",
]


def test_uploads_leave_checkpoints_and_private_files_out_also_in_subfolders() -> None:
    kept = list(filter_repo_objects(RUN_FILES, ignore_patterns=list(UPLOAD_IGNORE_PATTERNS)))
    assert kept == [
        "README.md",
        "fuzzy_boolean_results.json",
        "modeling_neural_interpreter.py",
        "pretrain/model.safetensors",
        "adapt-all/config.json",
    ]


def test_push_folder_creates_the_repo_and_uploads_the_folder_with_those_patterns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, dict]] = []

    class FakeApi:
        def __init__(self, token=None):
            calls.append(("init", {"token": token}))

        def create_repo(self, repo_id, private=None, exist_ok=False):
            calls.append(("create_repo", {"repo_id": repo_id, "private": private, "exist_ok": exist_ok}))
            return type("Repo", (), {"repo_id": repo_id})()

        def upload_folder(self, **kwargs):
            calls.append(("upload_folder", kwargs))
            return type("Commit", (), {"commit_url": "https://hf.co/me/run/commit/abc"})()

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    url = push_folder(tmp_path, "me/run", commit_message="a run", token="t", private=True, revision="dev")
    assert url == "https://hf.co/me/run/commit/abc"
    assert calls[1] == ("create_repo", {"repo_id": "me/run", "private": True, "exist_ok": True})
    upload = calls[2][1]
    assert upload["folder_path"] == str(tmp_path) and upload["repo_id"] == "me/run"
    assert upload["commit_message"] == "a run" and upload["revision"] == "dev"
    assert upload["ignore_patterns"] == list(UPLOAD_IGNORE_PATTERNS)


def test_push_failure_explains_the_cause_and_the_command_that_uploads_later() -> None:
    offline = explain_push_failure(OfflineModeIsEnabled("offline"), "out/run", "me/run")
    assert "HF_HUB_OFFLINE is set" in offline and "saved locally in out/run" in offline
    assert "hf upload me/run out/run . --exclude '_*' --exclude 'checkpoint-*'" in offline
    refused = explain_push_failure(PermissionError("403 Forbidden"), "out/run", "me/run")
    assert "refused the upload (PermissionError: 403 Forbidden)" in refused


def test_without_a_known_launcher_the_command_is_reconstructed_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ni_hf.training.publishing, "detect_launch", Launch)  # a parent that is no launcher
    for key in [k for k in os.environ if k.startswith("ACCELERATE_")]:
        monkeypatch.delenv(key)
    command, note = reconstruct_command("examples/run.py", ["--a", "b c"], 1)
    assert command == "python examples/run.py --a 'b c'" and note == "1 process; started without a launcher"
    command, note = reconstruct_command("examples/run.py", [], 2)
    assert command.startswith("torchrun --nproc_per_node 2 ") and "reconstructed from the environment" in note
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    assert reconstruct_command("examples/run.py", [], 4)[0].startswith("accelerate launch --num_processes 4 ")
    assert warn_if_fewer_processes(1, "examples/run.py") is None


@pytest.mark.parametrize(
    ("parent", "expected"),
    [
        (["/v/bin/python3", "/v/bin/accelerate", "launch", "--num-processes=2", "--cpu", "r.py"], ("accelerate launch", 2)),
        (["/v/bin/python", "/v/bin/torchrun", "--nproc_per_node", "4", "r.py"], ("torchrun", 4)),
        (["python", "-u", "-m", "torch.distributed.run", "--nproc-per-node=3", "r.py"], ("python -m torch.distributed.run", 3)),
        (["/v/bin/python", "/v/bin/torchrun", "--nproc_per_node", "gpu", "r.py"], ("torchrun", None)),
        (["/v/bin/python", "/v/bin/accelerate", "config"], (None, None)),
        (["bash"], (None, None)),
    ],
)  # fmt: skip
def test_the_launcher_is_read_from_the_parents_command_line(
    monkeypatch: pytest.MonkeyPatch, parent: list[str], expected: tuple
) -> None:
    monkeypatch.setattr(ni_hf.training.publishing, "_cmdline", lambda pid: parent)
    launch = ni_hf.training.publishing.detect_launch()
    assert (launch.launcher, launch.requested_processes) == expected
    if launch.launcher:
        assert launch.argv[-1] == "r.py" and " ".join(launch.argv).startswith(launch.launcher)


# Records what a script under a launcher records; publishing.py is loaded from its file (no torch import).
PROBE = textwrap.dedent(
    f"""
    import importlib.util, json, os, sys
    spec = importlib.util.spec_from_file_location("publishing", {str(Path(ni_hf.training.publishing.__file__))!r})
    publishing = sys.modules["publishing"] = importlib.util.module_from_spec(spec)  # dataclasses look it up
    spec.loader.exec_module(publishing)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    command, note = publishing.reconstruct_command(__file__, sys.argv[1:], world)
    warning = publishing.warn_if_fewer_processes(world, __file__)
    with open(f"record_{{os.environ.get('RANK', '0')}}.json", "w") as f:  # two processes share one stdout
        json.dump(dict(world=world, command=command, note=note, warning=warning), f)
    """
)


def launch(tmp_path: Path, *launcher: str) -> list[dict]:
    """Run the probe as ``launcher probe.py --seed 3 --name 'a b'`` in ``tmp_path``; each process's record."""
    (tmp_path / "probe.py").write_text(PROBE)
    for old in tmp_path.glob("record_*.json"):
        old.unlink()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    command = [*launcher, "probe.py", "--seed", "3", "--name", "a b"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return [json.loads(path.read_text()) for path in sorted(tmp_path.glob("record_*.json"))]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


ACCELERATE = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"


def test_accelerate_on_a_cpu_records_its_command_and_says_how_two_processes_start(tmp_path: Path) -> None:
    """`accelerate launch --num_processes 2 --cpu` starts one process: recorded as given, and explained."""
    (record,) = launch(tmp_path, ACCELERATE, "launch", "--num_processes", "2", "--cpu")
    assert record["world"] == 1
    assert record["command"] == "accelerate launch --num_processes 2 --cpu probe.py --seed 3 --name 'a b'"
    assert "which asked for 2 processes" in record["note"]
    assert "was asked for 2 processes, but this run has 1 (accelerate's --cpu launcher" in record["warning"]
    assert (
        "`accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no"
        in record["warning"]
    )
    assert "`torchrun --nproc_per_node 2 probe.py --use_cpu true ...`" in record["warning"]


def test_two_processes_record_the_launchers_command_line_with_all_its_flags(tmp_path: Path) -> None:
    """The working two-process CPU command (HF-NOTES): two processes, each records the command with --multi_gpu."""
    flags = ["--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no"]
    flags += ["--dynamo_backend", "no", "--main_process_port", str(free_port())]
    records = launch(tmp_path, ACCELERATE, "launch", *flags)
    assert [r["world"] for r in records] == [2, 2] and all(r["warning"] is None for r in records)
    expected = f"accelerate launch {' '.join(flags)} probe.py --seed 3 --name 'a b'"
    assert [r["command"] for r in records] == [expected, expected]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "0"]
    records = launch(tmp_path, *torchrun)
    expected = (
        "python -m torch.distributed.run --nproc_per_node 2 --master_port 0 probe.py --seed 3 --name 'a b'"
    )
    assert [r["command"] for r in records] == [expected, expected]


def _args(**overrides) -> SimpleNamespace:
    settings = dict(
        hub_model_id=None, output_dir="runs/my-run", hub_token=None, hub_private_repo=None, hub_revision=None
    )
    return SimpleNamespace(**{**settings, **overrides})


def test_the_repo_is_the_hub_model_id_else_the_output_folders_name() -> None:
    assert hub_repo_id(_args()) == "my-run"
    assert hub_repo_id(_args(hub_model_id="me/run")) == "me/run"


@pytest.mark.parametrize(
    ("offline", "token", "overrides", "match"),
    [
        (True, "hf_x", {}, "--push_to_hub: HF_HUB_OFFLINE is set"),
        (False, None, {}, "--push_to_hub needs a write token"),
        (False, "hf_x", {"hub_model_id": "me/a/b"}, "--hub_model_id 'me/a/b' is not a Hub repo id"),
        (
            False,
            "hf_x",
            {"output_dir": "runs/bad name!"},
            "--output_dir's name \\(pass --hub_model_id\\) 'bad name!'",
        ),
    ],
)
def test_a_push_that_cannot_work_is_refused_naming_why(
    monkeypatch: pytest.MonkeyPatch, offline: bool, token: str | None, overrides: dict, match: str
) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: token)
    with pytest.raises(ValueError, match=match):
        check_push(_args(**overrides))


def test_a_push_that_can_work_passes_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    check_push(_args(hub_token="hf_x", hub_model_id="me/run"))


def test_push_run_uploads_with_the_runs_settings_and_exits_1_saying_how_to_upload_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls = []

    def upload(folder, repo_id, **kwargs):
        calls.append((folder, repo_id, kwargs))
        return "https://hf.co/me/run/commit/1"

    monkeypatch.setattr(ni_hf.training.publishing, "push_folder", upload)
    args = _args(hub_model_id="me/run", hub_token="t", hub_private_repo=True, hub_revision="dev")
    assert push_run(tmp_path, args, "a run") == "https://hf.co/me/run/commit/1"
    assert calls == [
        (tmp_path, "me/run", {"commit_message": "a run", "token": "t", "private": True, "revision": "dev"})
    ]

    def unreachable(*args, **kwargs):
        raise ConnectionError("the network is unreachable")

    monkeypatch.setattr(ni_hf.training.publishing, "push_folder", unreachable)
    with caplog.at_level(logging.INFO), pytest.raises(SystemExit) as exit_info:
        push_run(tmp_path, args, "a run")
    assert exit_info.value.code == 1
    assert f"hf upload me/run {tmp_path} ." in caplog.text and "network is unreachable" in caplog.text
