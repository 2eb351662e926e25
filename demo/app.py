"""Gradio demo: a Neural Interpreter reads a digit; see its prediction and computational path, live.

Upload or draw a digit, pick the task, and move the controls of dynamic inference: the number of function
iterations (anytime inference) and a checkbox per function to switch it off; the prediction and the picture of
which function takes which patch at which iteration update at once.

    python demo/app.py                      # the quickstart model (trained here on first start when absent)
    python demo/app.py --model CKPT_OR_HUB_ID --port 7860
    NI_DEMO_MODEL=CKPT python demo/app.py   # the same through the environment (as a Space would set it)

Runs on a CPU. Without --model / NI_DEMO_MODEL it uses runs/quickstart, the model of the README's quickstart command,
and runs that command first when the folder holds no model (demo/quickstart.py, a few minutes on 2 cores). A
checkpoint whose weights do not fit a Neural Interpreter is refused (--allow_mismatched_weights shows it anyway), and
so is one whose weights differ from their recorded SHA-256. An uploaded or drawn digit is framed as the chosen task's
training digits are (``FRAMES``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from PIL import Image

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
try:
    import ni_hf
except ImportError:  # a checkout without `pip install -e .`: the package sits in ../src
    sys.path.insert(0, str(ROOT / "src"))
    import ni_hf
from ni_hf import visualization as vis  # noqa: E402
from ni_hf.training.checkpoints import load_checked  # noqa: E402

sys.path.insert(0, str(HERE))
from quickstart import QUICKSTART_OUTPUT_DIR, train_quickstart_model  # noqa: E402

README_QUICKSTART = QUICKSTART_OUTPUT_DIR


def resolve_model(model: str | None) -> tuple[str, str]:
    """(checkpoint path or Hub id, a note for the page): the given one, else the README quickstart's, trained now
    when absent."""
    model = model or os.environ.get("NI_DEMO_MODEL")
    if model:
        return model, f"Model: `{model}`."
    if (README_QUICKSTART / "config.json").is_file():
        return str(README_QUICKSTART), f"Model: the README's quickstart model (`{README_QUICKSTART}`)."
    print(f"No checkpoint given or found: training the README's quickstart model into {README_QUICKSTART}.")
    result = train_quickstart_model(README_QUICKSTART)
    return str(README_QUICKSTART), (
        f"No checkpoint was given or found, so this demo **trained the README's quickstart model just now** on "
        f"scikit-learn's 8x8 digits ({result['train_seconds']:.0f} s, {result['test_accuracy']:.1%} on the 360 "
        f"held-out digits; saved to `{README_QUICKSTART}`)."
    )


class DigitFrame(NamedTuple):
    """How a task's training digits are framed: the frame's side over the ink box's longer side (the ink: pixels above
    a quarter of the brightest), and the frame's side in pixels (None: any)."""

    scale: float
    size: int | None = None


# The median over each task's training images, measured by tests/test_demo.py: scikit-learn's 8x8 digits fill their
# frame; MNIST centres a 20-pixel box in 28 pixels; MNIST-M is MNIST's digits padded to 32 pixels.
FRAMES: dict[str, DigitFrame] = {
    "sklearn_digits": DigitFrame(1.0, 8),
    "mnist": DigitFrame(1.4, 28),
    "mnistm": DigitFrame(1.6, 32),
}
DEFAULT_FRAME = DigitFrame(
    FRAMES["mnist"].scale
)  # a task not listed: MNIST's framing, at the image's resolution


def prepare_digit(image: Image.Image, frame: DigitFrame = DEFAULT_FRAME) -> Image.Image:
    """Grey, light digit on a black background (inverted when the background is light), cropped to a square
    ``frame.scale`` times its ink box around it and sized ``frame.size``, as a task's training digits are (``FRAMES``)."""
    if not frame.scale > 0 or (frame.size is not None and frame.size < 1):
        raise ValueError(f"frame: expected a positive scale and size, got {frame}.")
    grey = np.asarray(image.convert("L"), dtype=np.float32)
    if image.mode in ("RGBA", "LA") and np.asarray(image.getchannel("A")).min() < 255:
        # a drawing: strokes on a transparent canvas; the ink is where alpha is
        grey = np.asarray(image.getchannel("A"), dtype=np.float32) * (255.0 - grey) / 255.0
    else:
        border = np.concatenate([grey[0], grey[-1], grey[:, 0], grey[:, -1]])
        if np.median(border) > 127:
            grey = 255.0 - grey
        # the background to 0 and the ink to 255, as in the training digits (photos are neither)
        grey = (grey - np.median(255.0 - border if np.median(border) > 127 else border)).clip(0, None)
        grey = grey * (255.0 / grey.max()) if grey.max() > 0 else grey
    ink = np.argwhere(grey > 0.25 * grey.max()) if grey.max() > 0 else np.zeros((0, 2))
    out = Image.fromarray(grey.clip(0, 255).astype(np.uint8))
    if len(ink):
        (top, left), (bottom, right) = ink.min(0), ink.max(0) + 1
        side = max(1, round(max(bottom - top, right - left) * frame.scale))
        cy, cx = (top + bottom) // 2, (left + right) // 2
        out = out.crop((cx - side // 2, cy - side // 2, cx - side // 2 + side, cy - side // 2 + side))
    if frame.size is not None and out.size != (frame.size, frame.size):
        # to the training digits' own resolution first: the processor then resizes it as it resized them
        out = out.resize(
            (frame.size, frame.size), Image.Resampling.BOX if out.width > frame.size else Image.BILINEAR
        )
    return out


class InterpreterDemo:
    """The model and its processor; `run` gives the predictions and the computational path for the controls."""

    def __init__(self, model: str, allow_mismatched_weights: bool = False) -> None:
        model_class = ni_hf.NeuralInterpreterForImageClassification
        self.model = load_checked(model_class, model, allow_mismatched_weights, option="--model").eval()
        self.processor = ni_hf.NeuralInterpreterImageProcessor.from_pretrained(model)
        config = self.model.config
        self.task_names = list(config.task_names)
        self.num_functions = config.num_functions
        self.max_iterations = int(config.iterations_per_script[0])
        self.num_scripts = config.num_scripts

    def run(
        self, image: Image.Image, task: str, iterations: int, switched_off: list[str]
    ) -> tuple[dict[str, float], Image.Image, str]:
        """(class probabilities, the computational path picture, a one-line summary)."""
        if not isinstance(image, Image.Image):
            raise ValueError(f"image: expected a PIL image of a digit, got {type(image).__name__}.")
        if task not in self.task_names:
            raise ValueError(f"task {task!r}: expected one of the model's tasks {self.task_names}.")
        if not 1 <= int(iterations) <= self.max_iterations:
            raise ValueError(f"iterations: expected 1 to {self.max_iterations}, got {iterations}.")
        functions = [f"function {u}" for u in range(self.num_functions)]
        unknown = [name for name in switched_off if name not in functions]
        if unknown:
            raise ValueError(f"switched_off: {unknown} are not among {functions}.")
        digit = prepare_digit(image, FRAMES.get(task, DEFAULT_FRAME))
        pixels = self.processor(images=[digit], return_tensors="pt")["pixel_values"]
        off = sorted(int(name.split()[-1]) for name in switched_off)
        trace = vis.trace_routing(
            self.model,
            pixels,
            [self.task_names.index(task)],
            num_function_iterations=int(iterations),
            disabled_functions=off,
        )
        probabilities = trace.probabilities[0]
        scores = {trace.class_names[i]: float(p) for i, p in enumerate(probabilities)}
        best = int(probabilities.argmax())
        summary = (
            f"Prediction: {trace.class_names[best]} (p = {probabilities[best]:.3f}) after {int(iterations)} of "
            f"{self.max_iterations} function iterations; functions off: {', '.join(map(str, off)) or 'none'}"
        )
        return scores, vis.figure_to_image(vis.plot_computational_path(trace, 0), dpi=80), summary


INTRODUCTION = (
    "# Neural Interpreter: which function reads which patch\n"
    "A Neural Interpreter (Rahaman et al., NeurIPS 2021) routes every patch of the image, and the task's "
    "CLS token, to its functions at every function iteration: the compatibility C (Eq. 4) of a token's type "
    "with each function's signature. Upload or draw a digit (light on dark or dark on light), then change "
    "the number of function iterations or switch functions off and watch the prediction change.\n\n"
)


def build_app(demo: InterpreterDemo, note: str) -> Any:
    """The Gradio Blocks: input image (upload or draw), task, iterations slider, a checkbox per function."""
    import gradio as gr

    functions = [f"function {u}" for u in range(demo.num_functions)]
    with gr.Blocks(title="Neural Interpreter: routing", analytics_enabled=False) as app:
        gr.Markdown(INTRODUCTION + note)
        with gr.Row():
            with gr.Column(scale=1):
                with gr.Tab("Upload"):
                    upload = gr.Image(
                        type="pil",
                        label="Digit",
                        sources=["upload", "clipboard"],
                        height=280,
                        elem_id="upload",
                    )
                with gr.Tab("Draw"):
                    sketch = gr.Sketchpad(
                        type="pil",
                        label="Draw a digit (pick the brush first)",
                        canvas_size=(280, 280),
                        brush=gr.Brush(default_size=18, colors=["#000000"], color_mode="fixed"),
                        layers=False,
                        transforms=(),
                        elem_id="sketch",
                    )
                task = gr.Dropdown(demo.task_names, value=demo.task_names[0], label="Task", elem_id="task")
                iterations = gr.Slider(
                    1, demo.max_iterations, value=demo.max_iterations, step=1,
                    label="Function iterations (anytime inference)", elem_id="iterations",
                )  # fmt: skip
                switched_off = gr.CheckboxGroup(
                    functions, value=[], label="Switch functions off", elem_id="off"
                )
            with gr.Column(scale=2):
                summary = gr.Markdown("Upload or draw a digit.", elem_id="summary")
                scores = gr.Label(num_top_classes=3, label="Prediction", elem_id="prediction")
                picture = gr.Image(type="pil", label="Computational path", elem_id="path", interactive=False)

        current = gr.State(None)  # the image last uploaded or drawn: the controls re-run on it
        connect_events(
            demo, upload, sketch, [task, iterations, switched_off], current, [scores, picture, summary]
        )
    return app


def connect_events(
    demo: InterpreterDemo, upload: Any, sketch: Any, controls: list[Any], current: Any, shown: list[Any]
) -> None:
    """Run the model on an upload, on a drawing with ink in it, and again on ``current`` (the last image) when one
    of ``controls`` changes; the results go to ``current`` and ``shown`` (the scores, the picture, the summary)."""
    outputs = [current, *shown]

    def run(image, task_name, n, off):
        if image is None:
            return image, None, None, "Upload or draw a digit."
        return (image, *demo.run(image, task_name, n, off))

    def drawn(drawing, task_name, n, off):
        composite = drawing.get("composite") if isinstance(drawing, dict) else None
        ink = composite is not None and np.asarray(composite.convert("RGBA").getchannel("A")).any()
        return run(composite if ink else None, task_name, n, off)

    upload.change(run, [upload, *controls], outputs)
    sketch.change(drawn, [sketch, *controls], outputs)
    for component in controls:
        component.change(run, [current, *controls], outputs)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Neural Interpreter routing demo")
    parser.add_argument(
        "--model",
        default=None,
        help="checkpoint folder or Hub id (default: NI_DEMO_MODEL, else runs/quickstart)",
    )
    parser.add_argument(
        "--allow_mismatched_weights",
        action="store_true",
        help="show a checkpoint whose weights leave parameters of the model missing or have other shapes",
    )
    parser.add_argument("--host", default=None, help="default: GRADIO_SERVER_NAME, else 127.0.0.1")
    parser.add_argument("--port", type=int, default=None, help="default: GRADIO_SERVER_PORT, else 7860")
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("NI_DEMO_THREADS", "1")))
    model, note = resolve_model(args.model)
    app = build_app(InterpreterDemo(model, args.allow_mismatched_weights), note)
    import gradio as gr

    # System fonts: the page then loads nothing from outside the server.
    theme = gr.themes.Default(
        font=["ui-sans-serif", "system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"]
    )
    app.launch(server_name=args.host, server_port=args.port, ssr_mode=False, theme=theme, footer_links=[])


if __name__ == "__main__":
    main()
