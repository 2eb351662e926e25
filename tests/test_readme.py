"""The README's Quickstart code runs as printed (offline, in a fresh directory and process), and what it builds
works: the reloaded model gives the saved one's logits, the pipeline gives its probabilities over every label."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks(section: str) -> list[str]:
    """The ```python blocks of one `## section` of the README."""
    text = README.read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return [block.split("```", 1)[0] for block in body.split("```python\n")[1:]]


def test_readme_quickstart_runs_as_printed_and_its_checkpoint_gives_the_models_predictions(
    tmp_path: Path,
) -> None:
    (code,) = python_blocks("Quickstart")
    check = textwrap.dedent(
        """
        assert out.logits.shape == (2, 10) and out.loss.ndim == 0 and torch.isfinite(out.loss)
        assert len(out.compatibilities) == sum(config.iterations_per_script)
        model.eval()
        reloaded = AutoModelForImageClassification.from_pretrained("ckpt").eval()
        with torch.no_grad():
            logits = model(**batch, task_ids=torch.tensor([0, 2])).logits
            torch.testing.assert_close(reloaded(**batch, task_ids=torch.tensor([0, 2])).logits, logits)
            first = model(**processor(images=images[:1], return_tensors="pt")).logits[0]  # the default task
        classify = pipeline("image-classification", model="ckpt", trust_remote_code=True, top_k=config.num_labels)
        result = classify(images[0])
        assert sorted(r["label"] for r in result) == sorted(config.id2label.values()), result
        assert abs(sum(r["score"] for r in result) - 1) < 1e-5, result
        scores = {r["label"]: r["score"] for r in result}
        expected = first.softmax(-1)
        assert all(abs(scores[config.id2label[i]] - float(p)) < 1e-5 for i, p in enumerate(expected)), result
        print("QUICKSTART_OK")
        """
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    proc = subprocess.run(
        [sys.executable, "-c", code + check],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "QUICKSTART_OK" in proc.stdout
    assert (tmp_path / "ckpt" / "model.safetensors").is_file()
    assert (tmp_path / "ckpt" / "modeling_neural_interpreter.py").is_file()
