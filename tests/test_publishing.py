"""ni_hf.training.publishing: what an upload sends (checkpoints stay local), and the message when it cannot."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import SimpleNamespace

import huggingface_hub
import pytest
from huggingface_hub.errors import OfflineModeIsEnabled
from huggingface_hub.utils import filter_repo_objects

import ni_hf.training.publishing
from ni_hf.training.publishing import (
    UPLOAD_IGNORE_PATTERNS,
    check_push,
    explain_push_failure,
    hub_repo_id,
    push_folder,
    push_run,
    reconstruct_command,
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


def test_reconstructed_command_names_the_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("ACCELERATE_")]:
        monkeypatch.delenv(key)
    assert reconstruct_command("examples/run.py", ["--a", "b c"], 1)[0].endswith("run.py --a 'b c'")
    assert reconstruct_command("examples/run.py", [], 2)[0].startswith("torchrun --nproc_per_node 2 ")
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    assert reconstruct_command("examples/run.py", [], 4)[0].startswith("accelerate launch --num_processes 4 ")


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
