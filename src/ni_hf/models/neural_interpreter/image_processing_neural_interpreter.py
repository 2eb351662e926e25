"""Image processors of Neural Interpreters: images to patch tokens (paper, section 4.2), PGM puzzles to panels (4.3).

`NeuralInterpreterImageProcessor` (PIL backend; needs no torchvision) and `NeuralInterpreterImageProcessorTorchvision`
(batched torch; needs torchvision) are transformers' backends plus a patchify step; `NeuralInterpreterPanelProcessor`
turns PGM puzzles into 16 grayscale panels. The library resizes, converts to RGB, rescales and normalises; what is
ours is patchify, reading arrays of every dtype as the equivalent PIL image, and errors that name the bad input.

The module imports no sibling module: `save_pretrained` copies it into a checkpoint folder, which then loads with
`trust_remote_code=True` where ni_hf is not installed.
"""

from typing import Any, TypeVar

import numpy as np
import PIL.Image
import torch
from transformers.image_processing_backends import PilBackend, TorchvisionBackend
from transformers.image_processing_base import BatchFeature
from transformers.image_transforms import convert_to_rgb
from transformers.image_utils import (
    ChannelDimension,
    ImageInput,
    PILImageResampling,
    SizeDict,
    infer_channel_dimension_format,
    load_image,
)
from transformers.processing_utils import ImagesKwargs
from transformers.utils import TensorType, is_torch_tensor, is_torchvision_available

ArrayT = TypeVar("ArrayT")

_CHANNEL_COUNTS = (1, 3, 4)
# PIL modes of more than 8 bits, read as arrays (uint16, int32, float32): PIL's own RGB conversion clips them.
_HIGH_DEPTH_MODES = ("I", "I;16", "I;16B", "I;16L", "I;16N", "F")
_PIL_MODES_WITHOUT_CONVERSION = ("L", "RGB", "RGBA", *_HIGH_DEPTH_MODES)
# The largest value of 8, 10, 12, 14, 16 and 32-bit data: an image's range is the first that holds its brightest pixel.
_DEPTH_MAXIMA = (255, 1023, 4095, 16383, 65535, 2**32 - 1)


def _check_patch_size(patch_size: Any) -> int:
    """Return `patch_size` if it is a positive integer, else raise a ValueError."""
    if isinstance(patch_size, bool) or not isinstance(patch_size, (int, np.integer)) or patch_size <= 0:
        raise ValueError(f"`patch_size` must be a positive integer, got {patch_size!r}.")
    return int(patch_size)


def _permute(x: ArrayT, axes: tuple[int, ...]) -> ArrayT:
    return x.transpose(axes) if isinstance(x, np.ndarray) else x.permute(axes)


def patchify(pixel_values: ArrayT, patch_size: int) -> ArrayT:
    """Cut `(..., C, H, W)` images into patches `(..., (H/p)*(W/p), p*p*C)`: einops `c (h p1) (w p2) -> (h w) (p1 p2 c)`."""
    patch_size = _check_patch_size(patch_size)
    if pixel_values.ndim < 3:
        raise ValueError(f"Expected images of shape (..., C, H, W), got shape {tuple(pixel_values.shape)}.")
    *lead, channels, height, width = pixel_values.shape
    if height % patch_size or width % patch_size:
        raise ValueError(
            f"patch_size={patch_size} must divide the image height and width, got an image of size "
            f"{height}x{width} (height x width). Resize the images (do_resize=True) to a multiple of patch_size."
        )
    grid_h, grid_w = height // patch_size, width // patch_size
    n = len(lead)
    x = pixel_values.reshape(*lead, channels, grid_h, patch_size, grid_w, patch_size)
    x = _permute(x, (*range(n), n + 1, n + 3, n + 2, n + 4, n))  # (..., h, w, p1, p2, c)
    return x.reshape(*lead, grid_h * grid_w, patch_size * patch_size * channels)


def unpatchify(patches: ArrayT, patch_size: int, height: int, width: int) -> ArrayT:
    """Inverse of `patchify`: `(..., (H/p)*(W/p), p*p*C)` patches back to `(..., C, H, W)` images."""
    patch_size = _check_patch_size(patch_size)
    if patches.ndim < 2:
        raise ValueError(
            f"Expected patches of shape (..., num_patches, patch_dim), got shape {tuple(patches.shape)}."
        )
    if height % patch_size or width % patch_size:
        raise ValueError(f"patch_size={patch_size} must divide height={height} and width={width}.")
    *lead, num_patches, patch_dim = patches.shape
    grid_h, grid_w = height // patch_size, width // patch_size
    if num_patches != grid_h * grid_w or patch_dim % (patch_size * patch_size):
        raise ValueError(
            f"Patches of shape {tuple(patches.shape)} do not match a {height}x{width} image with "
            f"patch_size={patch_size} (expected {grid_h * grid_w} patches of size patch_size*patch_size*channels)."
        )
    channels = patch_dim // (patch_size * patch_size)
    n = len(lead)
    x = patches.reshape(*lead, grid_h, grid_w, patch_size, patch_size, channels)
    x = _permute(x, (*range(n), n + 4, n, n + 2, n + 1, n + 3))  # (..., c, h, p1, w, p2)
    return x.reshape(*lead, channels, height, width)


# ---------------------------------------------------------------------------------------------------------------
# Reading pixels: every array as the equivalent PIL image, or refused by name
# ---------------------------------------------------------------------------------------------------------------


def _dtype_kind(image: Any) -> str:
    """numpy's dtype kind of an array or tensor: "b" bool, "u" unsigned, "i" signed, "f" float, "c" complex."""
    if isinstance(image, np.ndarray):
        return image.dtype.kind
    dtype = image.dtype
    if dtype == torch.bool:
        return "b"
    if dtype.is_complex:
        return "c"
    return "f" if dtype.is_floating_point else "i" if dtype.is_signed else "u"


def _cast(image: ArrayT, dtype: str) -> ArrayT:
    return image.astype(dtype) if isinstance(image, np.ndarray) else image.to(getattr(torch, dtype))


def _value_range(image: Any) -> tuple[float, float]:
    if is_torch_tensor(image) and image.dtype in (torch.uint16, torch.uint32, torch.uint64):
        image = image.to(torch.float64)  # torch has no min/max kernels for these
    return float(image.min()), float(image.max())


def _is_finite(image: Any) -> bool:
    return bool(np.isfinite(image).all() if isinstance(image, np.ndarray) else torch.isfinite(image).all())


def _on_uint8_scale(image: ArrayT, what: str, do_rescale: bool | None) -> ArrayT:
    """Pixels on the 0..255 scale of uint8, whether they come from a PIL image ("1", "L", "I;16", "I", "F") or not.

    bool is 0 or 255 (mode "1"), uint8 is kept. With `do_rescale`, other integers (uint16, int32, ...: "I;16", "I")
    and floats ("F") are scaled from their range: the first of 8, 10, 12, 14, 16 or 32 bits that holds the brightest
    pixel, or [0, 1] for floats within it; integers of 8-bit range become uint8. Without `do_rescale` values are kept
    (as float32). Complex, int8, negative integers and non-finite values are refused, naming `what`.
    """
    kind, itemsize = _dtype_kind(image), image.dtype.itemsize
    if kind == "u" and itemsize == 1:
        return image
    if kind == "b":
        return _cast(image, "uint8") * 255
    if kind not in "uif":
        raise ValueError(f"{what} has no real pixel values: expected bool, integer or float pixels.")
    if kind == "f" and not _is_finite(image):
        raise ValueError(f"{what} contains NaN or infinite values: expected finite pixel values.")
    low, high = _value_range(image)
    if kind == "i" and itemsize == 1:
        raise ValueError(
            f"{what} has values in [{low}, {high}]: int8 is not a pixel type (PIL has no signed 8-bit mode); "
            "expected uint8 (0 to 255), or another integer type with values from 0."
        )
    if kind in "ui" and low < 0:
        raise ValueError(
            f"{what} has values in [{low}, {high}]: expected values from 0 to at most {_DEPTH_MAXIMA[-1]} (unsigned "
            "pixels of 8 to 32 bits). Convert them to pixels yourself."
        )
    if not do_rescale:
        return _cast(image, "float32")
    if low < 0 or high > _DEPTH_MAXIMA[-1]:
        raise ValueError(
            f"{what} has values in [{low}, {high}]: expected values from 0 to at most {_DEPTH_MAXIMA[-1]} (floats in "
            "[0, 1], or pixels of 8 to 32 bits); pass do_rescale=False for values already on the model's scale."
        )
    full = 1.0 if kind == "f" and high <= 1 else next(m for m in _DEPTH_MAXIMA if high <= m)
    if kind in "ui" and full == 255:
        return _cast(image, "uint8")
    return _cast(_cast(image, "float64") * (255.0 / full), "float32")


def _check_has_pixels(shape: tuple[int, ...]) -> None:
    """Refuse an image without pixels (resizing would turn it into an all-black input)."""
    if 0 in shape:
        raise ValueError(f"Got an empty image of shape {shape}: expected a height and a width of at least 1.")


def _to_channels_first(image: ArrayT, input_data_format: str | ChannelDimension | None) -> ArrayT:
    """Turn a 2-D (H, W) or 3-D (C, H, W)/(H, W, C) array or tensor of 1, 3 or 4 channels into (C, H, W)."""
    shape = tuple(int(s) for s in image.shape)
    if image.ndim not in (2, 3):
        raise ValueError(
            f"Expected each image to be 2-D (H, W) or 3-D (C, H, W) / (H, W, C), got an array of shape "
            f"{shape} ({image.ndim}-D)."
        )
    _check_has_pixels(shape)
    if image.ndim == 2:
        return image[None]
    expected = "expected 1 (gray), 3 (RGB) or 4 (RGBA) channels"
    if input_data_format is None:
        try:
            input_data_format = infer_channel_dimension_format(image, num_channels=_CHANNEL_COUNTS)
        except ValueError:
            raise ValueError(
                f"Unsupported image shape {shape}: {expected} on the first axis (C, H, W) or the last axis "
                "(H, W, C). Pass `input_data_format` if the layout is ambiguous."
            ) from None
    if ChannelDimension(input_data_format) == ChannelDimension.LAST:
        image = np.moveaxis(image, -1, 0) if isinstance(image, np.ndarray) else image.movedim(-1, 0)
    if int(image.shape[0]) not in _CHANNEL_COUNTS:
        raise ValueError(
            f"Unsupported number of channels {int(image.shape[0])} for an image of shape {shape}: {expected}."
        )
    return image


def _read_image(
    image: Any, index: int, do_rescale: bool | None, do_convert_rgb: bool | None, input_data_format: Any
) -> Any:
    """A PIL image of 8 bits as it is (the library converts it), any other image as (C, H, W) on the 0..255 scale.

    Float RGBA arrays are composited onto white on that scale here; the library composites uint8 RGBA.
    """
    is_pil = isinstance(image, PIL.Image.Image)
    what = (
        f"PIL image {index} in mode {image.mode!r}"
        if is_pil
        else f"Image {index} ({getattr(image, 'dtype', '')})"
    )
    if is_pil:
        _check_has_pixels((image.height, image.width))
        if image.mode not in _HIGH_DEPTH_MODES:
            if not do_convert_rgb and image.mode not in _PIL_MODES_WITHOUT_CONVERSION:
                raise ValueError(
                    f"PIL image in mode {image.mode!r} cannot be used with do_convert_rgb=False; expected one of "
                    f"{_PIL_MODES_WITHOUT_CONVERSION} or set do_convert_rgb=True."
                )
            return image
        image, input_data_format = np.asarray(image), None
    elif is_torch_tensor(image):
        image = image.detach()
    elif not isinstance(image, np.ndarray):
        raise ValueError(
            f"Unsupported image type {type(image).__name__}: expected a PIL.Image.Image, numpy.ndarray or torch.Tensor."
        )
    image = _on_uint8_scale(_to_channels_first(image, input_data_format), what, do_rescale)
    if do_convert_rgb and image.shape[0] == 4 and _dtype_kind(image) == "f":
        # The library composites floats in [0, 1] only; on the 0..255 scale white is 255.
        white = 255.0 if do_rescale else 1.0
        alpha = image[3:] / white
        image = image[:3] * alpha + (1 - alpha) * white
    return image


def _flatten_images(images: Any) -> list[Any]:
    """Flatten a single image, a 4-D batch, or (nested) lists of images into a flat list, loading paths and URLs."""
    if isinstance(images, str):
        return [load_image(images)]  # PIL decodes files on both backends (RGB), so they read the same pixels
    if isinstance(images, PIL.Image.Image):
        return [images]
    if isinstance(images, np.ndarray) or is_torch_tensor(images):
        if images.ndim in (2, 3):
            return [images]
        if images.ndim == 4:
            return list(images)
        raise ValueError(
            f"Expected an image of rank 2 (H, W) or 3 (C, H, W) / (H, W, C), or a rank-4 batch, got an array of "
            f"shape {tuple(images.shape)} ({images.ndim}-D)."
        )
    if isinstance(images, (list, tuple)):
        flat = [image for item in images for image in _flatten_images(item)]
        if not flat:
            raise ValueError("Expected at least one image, got an empty list of images.")
        return flat
    raise ValueError(
        f"Unsupported image type {type(images).__name__}: expected a PIL.Image.Image, numpy.ndarray, "
        "torch.Tensor, URL/path string, or a list of them."
    )


# ---------------------------------------------------------------------------------------------------------------
# Settings checks
# ---------------------------------------------------------------------------------------------------------------


def _check_settings(
    size: SizeDict | None,
    do_normalize: bool | None,
    image_std: Any,
    do_patchify: bool | None = None,
    patch_size: Any = None,
    do_resize: bool | None = None,
) -> None:
    """Raise a ValueError naming the setting that cannot give finite pixels (on a regular patch grid)."""
    sides = (None, None) if size is None else (size.height, size.width)
    if not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s > 0 for s in sides):
        shown = None if size is None else {k: v for k, v in dict(size).items() if v is not None}
        raise ValueError(
            f"`size` must be a dict of positive integers 'height' and 'width' (or one int for a square), got {shown}."
        )
    if do_normalize and image_std is not None and np.any(np.asarray(image_std, dtype=np.float64) == 0):
        raise ValueError(f"`image_std` must be non-zero (normalizing divides by it), got {image_std!r}.")
    if do_patchify:
        patch_size = _check_patch_size(patch_size)
        if do_resize and (size.height % patch_size or size.width % patch_size):
            raise ValueError(
                f"patch_size={patch_size} must divide the image size (height={size.height}, width={size.width})."
            )


def _check_channels(
    num_channels: Any, do_convert_rgb: bool | None, do_normalize: bool | None, image_mean: Any, image_std: Any
) -> None:
    """Refuse, by name, channels other than 1 and 3 and a mean or std given for another number of channels (unless
    `do_convert_rgb=False` keeps each image's own channels)."""
    if num_channels not in (1, 3) or isinstance(num_channels, bool):
        raise ValueError(f"`num_channels` must be 1 (grayscale) or 3 (RGB), got {num_channels!r}.")
    if num_channels == 3 and not do_convert_rgb:
        return
    for name, values in (("image_mean", image_mean), ("image_std", image_std)):
        count = np.asarray(values).size if do_normalize and values is not None else 1
        if count not in (1, num_channels):
            raise ValueError(
                f"`{name}` must hold one value per channel (num_channels={num_channels}), got {values!r}."
            )


def _to_gray(image: Any) -> Any:
    """An image read by `_read_image` in one channel: PIL's "L" of an 8-bit image (transparency composited onto
    white), PIL's "L" weights (ITU-R 601-2) in float for other pixels; (1, H, W) arrays stay as they are."""
    if isinstance(image, PIL.Image.Image):
        if image.mode == "L":
            return image
        return PIL.Image.fromarray(convert_to_rgb(image, return_numpy=True)).convert("L")
    image = image.cpu().numpy() if is_torch_tensor(image) else image
    if image.shape[0] == 1:
        return image
    if image.dtype == np.uint8:
        return np.asarray(_to_gray(PIL.Image.fromarray(np.moveaxis(image, 0, -1))))[None]
    return np.tensordot(np.array([0.299, 0.587, 0.114], np.float32), image[:3], axes=1)[None]


def _to_float32(images: list[Any]) -> list[Any]:
    return [_cast(image, "float32") for image in images]


def _stack(images: list[Any]) -> Any:
    """One array or tensor of equally sized images; a ValueError that says how to get them otherwise."""
    sizes = sorted({tuple(int(s) for s in image.shape[-2:]) for image in images})
    if len(sizes) > 1:
        raise ValueError(
            f"Images of different sizes {sizes} cannot be stacked into one tensor: keep do_resize=True (every "
            "image to `size`), or pass return_tensors=None for a list."
        )
    return np.stack(images) if isinstance(images[0], np.ndarray) else torch.stack(images)


# ---------------------------------------------------------------------------------------------------------------
# The image processors
# ---------------------------------------------------------------------------------------------------------------


class NeuralInterpreterImageProcessorKwargs(ImagesKwargs, total=False):
    """Keyword arguments of the Neural Interpreter image processors beyond `ImagesKwargs`.

    do_patchify (`bool`, *optional*, defaults to `True`):
        Whether to cut the processed images into flattened, non-overlapping square patches.
    patch_size (`int`, *optional*, defaults to 4):
        Side length (in pixels) of a square patch.
    num_channels (`int`, *optional*, defaults to 3):
        Channels of the images the model reads (its config's `num_channels`): 3, RGB (gray images replicated), or
        1, grayscale (colour images made gray as PIL's "L" makes them, transparency composited onto white).
    """

    do_patchify: bool | None
    patch_size: int | None
    num_channels: int | None


class _PilBackendKeepingFloats(PilBackend):
    """The PIL backend, resizing float images in float32 (the library's resize would round them to 8 bits)."""

    def resize(
        self,
        image: np.ndarray,
        size: SizeDict,
        resample: PILImageResampling | int | None = None,
        reducing_gap: int | None = None,
        **kwargs: Any,
    ) -> np.ndarray:
        """Resize a (C, H, W) image with PIL: uint8 by the library, other dtypes per channel in mode "F"."""
        if image.dtype == np.uint8:
            return super().resize(image, size, resample=resample, reducing_gap=reducing_gap, **kwargs)
        resample = PILImageResampling.BILINEAR if resample is None else resample
        return np.stack(
            [
                np.asarray(
                    PIL.Image.fromarray(np.ascontiguousarray(channel, dtype=np.float32)).resize(
                        (size.width, size.height), resample=resample, reducing_gap=reducing_gap
                    )
                )
                for channel in image
            ]
        )


class _NeuralInterpreterProcessing:
    """What both image-processor backends share: defaults, checks, reading the inputs, and patchify."""

    valid_kwargs = NeuralInterpreterImageProcessorKwargs
    model_input_names = ["pixel_values"]

    do_resize = True
    size = {"height": 32, "width": 32}
    resample = PILImageResampling.BILINEAR
    do_rescale = True
    rescale_factor = 1 / 255
    do_normalize = True
    image_mean = [0.5, 0.5, 0.5]
    image_std = [0.5, 0.5, 0.5]
    do_convert_rgb = True
    do_patchify = True
    patch_size = 4
    num_channels = 3

    def __init__(self, **kwargs: Any) -> None:
        """Build the processor; settings not given take the class defaults (a mean and std of one value, 0.5, for
        grayscale)."""
        if kwargs.get("num_channels") == 1:
            kwargs.setdefault("image_mean", [0.5])
            kwargs.setdefault("image_std", [0.5])
        super().__init__(**kwargs)
        _check_settings(
            self.size, self.do_normalize, self.image_std, self.do_patchify, self.patch_size, self.do_resize
        )
        _check_channels(
            self.num_channels, self.do_convert_rgb, self.do_normalize, self.image_mean, self.image_std
        )

    def _validate_preprocess_kwargs(self, **kwargs: Any) -> None:
        super()._validate_preprocess_kwargs(**kwargs)
        _check_settings(
            kwargs.get("size"),
            kwargs.get("do_normalize"),
            kwargs.get("image_std"),
            kwargs.get("do_patchify"),
            kwargs.get("patch_size"),
            kwargs.get("do_resize"),
        )
        num_channels = kwargs.get("num_channels") or self.num_channels
        _check_channels(
            num_channels,
            kwargs.get("do_convert_rgb"),
            kwargs.get("do_normalize"),
            kwargs.get("image_mean"),
            kwargs.get("image_std"),
        )

    def _prepare_image_like_inputs(self, images: ImageInput, *args: Any, **kwargs: Any) -> list[Any]:
        """A flat list of (C, H, W) images: pixels read by `_read_image`, converted by the backend's `process_image`
        (to RGB), or made gray first for `num_channels=1`."""
        kwargs.pop("expected_ndims", None)
        gray = (kwargs.get("num_channels") or self.num_channels) == 1
        settings = {**kwargs, "input_data_format": ChannelDimension.FIRST}
        if gray:
            settings["do_convert_rgb"] = False  # the library would make the gray image RGB again
        prepared = []
        for index, image in enumerate(_flatten_images(images)):
            pixels = _read_image(
                image,
                index,
                kwargs["do_rescale"],
                kwargs["do_convert_rgb"] or gray,
                kwargs.get("input_data_format"),
            )
            prepared.append(self.process_image(_to_gray(pixels) if gray else pixels, *args, **settings))
        return prepared

    def _preprocess(
        self,
        images: list[Any],
        return_tensors: str | TensorType | None,
        do_patchify: bool | None = None,
        patch_size: int | None = None,
        **kwargs: Any,
    ) -> BatchFeature:
        """The backend's resize, rescale and normalize, then patches `(num_patches, p * p * C)` if `do_patchify`."""
        pixel_values = _to_float32(super()._preprocess(images, return_tensors=None, **kwargs)["pixel_values"])
        if return_tensors is not None:
            pixel_values = _stack(pixel_values)
            pixel_values = patchify(pixel_values, patch_size) if do_patchify else pixel_values
        elif do_patchify:
            pixel_values = [patchify(x, patch_size) for x in pixel_values]
        return BatchFeature(data={"pixel_values": pixel_values}, tensor_type=return_tensors)

    def patchify(self, pixel_values: ArrayT, patch_size: int | None = None) -> ArrayT:
        """Patchify `(..., C, H, W)` images (numpy or torch) with `patch_size` (defaults to `self.patch_size`)."""
        return patchify(pixel_values, self.patch_size if patch_size is None else patch_size)

    def unpatchify(
        self, pixel_values: ArrayT, size: dict[str, int] | None = None, patch_size: int | None = None
    ) -> ArrayT:
        """Turn patchified `pixel_values` (numpy or torch) back into `(..., C, H, W)` images of `size`."""
        size = self.size if size is None else SizeDict(**size)
        patch_size = self.patch_size if patch_size is None else patch_size
        return unpatchify(pixel_values, patch_size, size.height, size.width)


class NeuralInterpreterImageProcessor(_NeuralInterpreterProcessing, _PilBackendKeepingFloats):
    r"""Neural Interpreter image processor (PIL backend): images to patch tokens.

    Resizes to `size` (default 32x32, bilinear), converts to RGB (gray replicated, alpha composited onto white) or,
    with `num_channels=1`, to grayscale (PIL's "L"), rescales by `rescale_factor` (1/255), normalizes with
    `image_mean`/`image_std` (0.5 each) and, if `do_patchify`, returns `pixel_values` of shape
    `(B, num_patches, patch_size * patch_size * num_channels)`: patches row-major over the grid, each laid out (row
    in patch, column in patch, channel), einops `c (h p1) (w p2) -> (h w) (p1 p2 c)`. With `do_patchify=False`,
    `pixel_values` are `(B, num_channels, H, W)` images. `size`, `patch_size` and `num_channels` follow the model's
    config (`image_size`, `patch_size`, `num_channels`); any size that `patch_size` divides is accepted.

    Arrays and tensors are read as the equivalent PIL image: uint8 as mode "L"/"RGB"/"RGBA", bool as mode "1",
    uint16 and other integers as "I;16"/"I", floats as "F": scaled from the bit depth (8 to 32 bits) their brightest
    pixel needs, floats within [0, 1] as already rescaled. Complex, int8, negative integers and NaN are refused, naming
    the image and its dtype. `do_rescale=False` takes an array's values as they are (already on the model's scale).
    With `do_convert_rgb=False` an image keeps its 1, 3 or 4 channels (give `image_mean`/`image_std` per channel).
    """

    def process_image(self, image: Any, *args: Any, **kwargs: Any) -> np.ndarray:
        """One image read by `_read_image` as a (C, H, W) numpy array, converted to RGB by the library."""
        if is_torch_tensor(image):
            image = image.cpu().numpy()
        return super().process_image(image, *args, **kwargs)


class NeuralInterpreterImageProcessorTorchvision(_NeuralInterpreterProcessing, TorchvisionBackend):
    r"""Neural Interpreter image processor (torchvision backend): the processing of `NeuralInterpreterImageProcessor`
    as batched torch operations, on the device given by `device=` (the input's by default, CPU for PIL and numpy).

    Same arguments, inputs, errors and saved `preprocessor_config.json` as the PIL processor; `AutoImageProcessor`
    returns this one where torchvision is installed (`backend="pil"` asks for the other). Images resized down differ
    from the PIL processor's by one grey level at most (the two antialiasing filters round differently). Without
    `return_tensors`, `pixel_values` is a list of torch tensors.
    """

    def __init__(self, **kwargs: Any) -> None:
        """Build the processor (see `NeuralInterpreterImageProcessor`); needs torchvision."""
        if not is_torchvision_available():
            raise ImportError(
                "NeuralInterpreterImageProcessorTorchvision needs torchvision (pip install torchvision, the build "
                "that matches your torch); without it, use NeuralInterpreterImageProcessor (the PIL backend), which "
                "AutoImageProcessor picks by itself."
            )
        super().__init__(**kwargs)

    def save_pretrained(
        self, save_directory: str | Any, push_to_hub: bool = False, **kwargs: Any
    ) -> list[str]:
        """Save what the PIL processor saves (its type, its `auto_map`), so the folder loads with either backend."""
        settings = {key: value for key, value in self.to_dict().items() if key != "image_processor_type"}
        pil = NeuralInterpreterImageProcessor(**settings)
        return pil.save_pretrained(save_directory, push_to_hub=push_to_hub, **kwargs)


# ---------------------------------------------------------------------------------------------------------------
# PGM puzzles (paper, section 4.3 and its appendix)
# ---------------------------------------------------------------------------------------------------------------


class NeuralInterpreterPanelProcessorKwargs(ImagesKwargs, total=False):
    """Keyword arguments of `NeuralInterpreterPanelProcessor` beyond `ImagesKwargs`.

    num_panels (`int`, *optional*, defaults to 16):
        Panels per puzzle: the 8 context panels of the incomplete 3x3 matrix, then the 8 candidate panels.
    """

    num_panels: int | None


def _panels_message(num_panels: int, got: int, what: str) -> str:
    return (
        f"PGM puzzles have {num_panels} panels ({num_panels // 2} context, {num_panels // 2} candidates), got "
        f"{got} ({what}); `num_panels` sets the count."
    )


def _split_puzzles(images: Any, num_panels: int) -> list[Any]:
    """A list of puzzles, each a rank-3 or rank-4 array or tensor, or a list of panels."""
    layouts = (
        f"one puzzle ({num_panels}, H, W), (H, W, {num_panels}) or ({num_panels}, H, W, 3), a list of "
        f"{num_panels} PIL images, or a batch of them: (B, {num_panels}, H, W) or a list of puzzles"
    )
    if isinstance(images, np.ndarray) or is_torch_tensor(images):
        one_rgb_puzzle = images.ndim == 4 and images.shape[-1] in (3, 4) and images.shape[0] == num_panels
        if images.ndim == 3 or one_rgb_puzzle:
            return [images]
        if images.ndim not in (4, 5):
            raise ValueError(f"Expected {layouts}; got an array of shape {tuple(images.shape)}.")
        if len(images) == 0:
            raise ValueError(
                f"Got an empty batch of shape {tuple(images.shape)}: expected at least one puzzle."
            )
        return list(images)
    if isinstance(images, (list, tuple)):
        if not images:
            raise ValueError("Got an empty list: expected at least one puzzle.")
        is_panel = [isinstance(x, PIL.Image.Image) or getattr(x, "ndim", None) == 2 for x in images]
        if all(is_panel):
            return [list(images)]
        if not any(is_panel) and all(isinstance(x, (list, tuple, np.ndarray, torch.Tensor)) for x in images):
            return list(images)
        raise ValueError(f"Expected {layouts}; got a list mixing panels and puzzles.")
    got = "one PIL image (a panel)" if isinstance(images, PIL.Image.Image) else type(images).__name__
    raise ValueError(f"Expected {layouts}; got {got}.")


def _numpy(image: Any) -> np.ndarray:
    """A PIL panel ("L" or a high-depth mode as it is, other modes to "L", alpha onto white), array or tensor."""
    if isinstance(image, PIL.Image.Image):
        if image.mode in ("L", *_HIGH_DEPTH_MODES):
            return np.asarray(image)
        return np.asarray(PIL.Image.fromarray(convert_to_rgb(image, return_numpy=True)).convert("L"))
    if is_torch_tensor(image):
        image = image.detach().cpu()
        return (image.float() if image.is_floating_point() else image).numpy()  # numpy has no bfloat16
    return np.asarray(image)


def _read_puzzle(
    puzzle: Any, index: int, num_panels: int, do_rescale: bool | None, input_data_format: Any
) -> np.ndarray:
    """One puzzle as a (num_panels, 1, H, W) numpy array on the 0..255 scale (uint8, or float32 for other dtypes)."""
    if isinstance(puzzle, (list, tuple)):
        panels = [_numpy(panel) for panel in puzzle]
        if len(panels) != num_panels:
            raise ValueError(_panels_message(num_panels, len(panels), f"puzzle {index}, a list of panels"))
        if len({p.shape for p in panels}) > 1 or panels[0].ndim != 2:
            raise ValueError(
                f"Puzzle {index}: expected {num_panels} 2-D panels of one size, got shapes "
                f"{sorted({p.shape for p in panels})}."
            )
        puzzle = np.stack(panels)
    else:
        puzzle, shape = _numpy(puzzle), tuple(puzzle.shape)
        if puzzle.ndim == 3 and input_data_format is None and shape[0] != num_panels:
            if shape[-1] == num_panels or shape[0] == shape[1] != shape[2]:
                # DeepMind's `image`, (160, 160, 16) by its shape but stored panel by panel: a reshape, as
                # ni_hf.data.pgm reads it (moving the last axis would scramble every panel).
                puzzle = puzzle.reshape(shape[-1], shape[0], shape[1])
        elif puzzle.ndim == 3 and input_data_format is not None:
            if ChannelDimension(input_data_format) == ChannelDimension.LAST:  # panels on the last axis, truly
                puzzle = np.moveaxis(puzzle, -1, 0)
        if puzzle.ndim not in (3, 4) or (puzzle.ndim == 4 and puzzle.shape[-1] != 3):
            raise ValueError(
                f"Puzzle {index} has shape {shape}: expected ({num_panels}, H, W), (H, W, {num_panels}) or "
                f"({num_panels}, H, W, 3)."
            )
        if puzzle.shape[0] != num_panels:
            raise ValueError(
                _panels_message(num_panels, puzzle.shape[0], f"puzzle {index}, of shape {shape}")
            )
    if 0 in puzzle.shape:
        raise ValueError(
            f"Puzzle {index} has shape {puzzle.shape}: expected panels of at least 1 x 1 pixels."
        )
    rgb = puzzle.ndim == 4
    puzzle = _on_uint8_scale(puzzle, f"Puzzle {index} ({puzzle.dtype})", do_rescale)
    if rgb and puzzle.dtype == np.uint8:
        puzzle = np.stack([np.asarray(PIL.Image.fromarray(panel).convert("L")) for panel in puzzle])
    elif rgb:
        puzzle = puzzle @ np.array([0.299, 0.587, 0.114], np.float32)  # PIL's "L" weights (ITU-R 601-2)
    return np.ascontiguousarray(puzzle[:, None])


class NeuralInterpreterPanelProcessor(_PilBackendKeepingFloats):
    r"""PGM puzzles (paper, section 4.3) as `pixel_values` of shape `(B, 16, 1, 80, 80)`, float32.

    A puzzle is 16 panels: the 8 context panels of an incomplete 3x3 matrix (row-major), then the 8 candidates. It
    comes as a `(16, H, W)` uint8 array or tensor, `(16, H, W, 3)` RGB, a list of 16 PIL images, or DeepMind's
    stored `image`: an `(H, W, 16)` array (taken when the last axis alone has 16 entries) that DeepMind's files
    store panel after panel, so it is reshaped to `(16, H, W)`, as `ni_hf.data.pgm` reads it, never transposed. A
    `(16, 16, 16)` array is read panels first, which is also DeepMind's reading; `input_data_format="channels_last"`
    says the panels truly lie along the last axis (`np.stack(panels, axis=-1)`). A batch comes as `(B, 16, H, W)`
    or a list of puzzles. Each panel is made grayscale (PIL's "L"), resized to `size` (80x80, bilinear, antialiased
    as PIL resizes; DeepMind's release is 160x160), rescaled to [0, 1] and normalised with mean and std 0.5, so it
    lies in [-1, 1]. Other dtypes are read as `NeuralInterpreterImageProcessor` reads them.
    """

    valid_kwargs = NeuralInterpreterPanelProcessorKwargs
    model_input_names = ["pixel_values"]

    do_resize = True
    size = {"height": 80, "width": 80}
    resample = PILImageResampling.BILINEAR
    do_rescale = True
    rescale_factor = 1 / 255
    do_normalize = True
    image_mean = [0.5]
    image_std = [0.5]
    num_panels = 16

    def __init__(self, **kwargs: Any) -> None:
        """Build the processor; settings not given take the class defaults."""
        super().__init__(**kwargs)
        self._check(self.size, self.do_normalize, self.image_std, self.num_panels)

    @staticmethod
    def _check(size: SizeDict | None, do_normalize: bool | None, image_std: Any, num_panels: Any) -> None:
        _check_settings(size, do_normalize, image_std)
        if isinstance(num_panels, bool) or not isinstance(num_panels, (int, np.integer)) or num_panels <= 0:
            raise ValueError(
                f"`num_panels` must be a positive integer (PGM puzzles have 16), got {num_panels!r}."
            )

    def _validate_preprocess_kwargs(self, **kwargs: Any) -> None:
        super()._validate_preprocess_kwargs(**kwargs)
        self._check(
            kwargs.get("size"), kwargs.get("do_normalize"), kwargs.get("image_std"), kwargs.get("num_panels")
        )

    def _prepare_image_like_inputs(self, images: Any, *args: Any, **kwargs: Any) -> list[np.ndarray]:
        """One (num_panels, 1, H, W) array per puzzle; layouts, panel counts and pixels are checked by name."""
        num_panels = kwargs["num_panels"]
        return [
            _read_puzzle(puzzle, index, num_panels, kwargs["do_rescale"], kwargs.get("input_data_format"))
            for index, puzzle in enumerate(_split_puzzles(images, num_panels))
        ]

    def _preprocess(
        self, images: list[np.ndarray], return_tensors: str | TensorType | None, **kwargs: Any
    ) -> BatchFeature:
        """The library's resize, rescale and normalize of every panel, regrouped into puzzles."""
        panels = super()._preprocess([p for puzzle in images for p in puzzle], return_tensors=None, **kwargs)
        panels, n = _to_float32(panels["pixel_values"]), len(images[0])
        puzzles = [np.stack(panels[i : i + n]) for i in range(0, len(panels), n)]
        pixel_values = puzzles if return_tensors is None else _stack(puzzles)
        return BatchFeature(data={"pixel_values": pixel_values}, tensor_type=return_tensors)


__all__ = [
    "NeuralInterpreterImageProcessor",
    "NeuralInterpreterImageProcessorTorchvision",
    "NeuralInterpreterPanelProcessor",
    "patchify",
    "unpatchify",
]
