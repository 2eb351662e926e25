"""Image processors for Neural Interpreters: resize, RGB, rescale, normalize and patchify to flat patch tokens.

Two backends, as transformers' own models have: `NeuralInterpreterImageProcessor` (PIL, numpy; needs no torchvision)
and `NeuralInterpreterImageProcessorTorchvision` (batched torch ops, on any device; needs torchvision). They take the
same arguments, accept the same inputs, raise the same errors and save the same `preprocessor_config.json`, so that
`AutoImageProcessor` picks the backend at load time (torchvision where it is installed, as for transformers' models).

This module is self-contained (no imports of sibling modules) so that ``save_pretrained`` can copy it into a
checkpoint folder and ``AutoImageProcessor.from_pretrained(..., trust_remote_code=True)`` can load it in a process
where ``ni_hf`` is not installed.
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
    is_valid_image,
    load_image,
)
from transformers.processing_utils import ImagesKwargs, Unpack
from transformers.utils import TensorType, is_torch_tensor, is_torchvision_available, logging

logger = logging.get_logger(__name__)

ArrayT = TypeVar("ArrayT")

_CHANNEL_COUNTS = (1, 3, 4)
# PIL modes of more than 8 bits: PIL's own conversion to RGB clips integers above 255 and rounds floats.
_HIGH_DEPTH_MODES = ("I", "I;16", "I;16B", "I;16L", "I;16N", "F")
_PIL_MODES_WITHOUT_CONVERSION = ("L", "RGB", "RGBA", *_HIGH_DEPTH_MODES)
# The largest value of 8, 10, 12, 14, 16 and 32-bit data.
_DEPTH_MAXIMA = (255, 1023, 4095, 16383, 65535, 2**32 - 1)


class NeuralInterpreterImageProcessorKwargs(ImagesKwargs, total=False):
    """Extra keyword arguments of `NeuralInterpreterImageProcessor` (on top of `ImagesKwargs`).

    do_patchify (`bool`, *optional*, defaults to `True`):
        Whether to cut the processed images into flattened, non-overlapping square patches.
    patch_size (`int`, *optional*, defaults to 4):
        Side length (in pixels) of a square patch.
    """

    do_patchify: bool | None
    patch_size: int | None


def _permute(x: ArrayT, axes: tuple[int, ...]) -> ArrayT:
    """Permute the axes of a numpy array or a torch tensor."""
    if isinstance(x, np.ndarray):
        return x.transpose(axes)
    return x.permute(*axes)


def _check_patch_size(patch_size: Any) -> int:
    """Return `patch_size` if it is a positive integer, else raise a ValueError."""
    if isinstance(patch_size, bool) or not isinstance(patch_size, (int, np.integer)) or patch_size <= 0:
        raise ValueError(f"`patch_size` must be a positive integer, got {patch_size!r}.")
    return int(patch_size)


def patchify(pixel_values: ArrayT, patch_size: int) -> ArrayT:
    """Cut `(..., C, H, W)` images into patches `(..., (H/p)*(W/p), p*p*C)`, laid out as `(p1 p2 c)`."""
    patch_size = _check_patch_size(patch_size)
    if pixel_values.ndim < 3:
        raise ValueError(f"Expected images of shape (..., C, H, W), got shape {tuple(pixel_values.shape)}.")
    *lead, channels, height, width = (int(s) for s in pixel_values.shape)
    if height % patch_size or width % patch_size:
        raise ValueError(
            f"patch_size={patch_size} must divide the image height and width, got an image of size "
            f"{height}x{width} (height x width). Resize the images (do_resize=True) to a multiple of patch_size."
        )
    grid_h, grid_w = height // patch_size, width // patch_size
    n = len(lead)
    x = pixel_values.reshape(*lead, channels, grid_h, patch_size, grid_w, patch_size)
    # (..., c, h, p1, w, p2) -> (..., h, w, p1, p2, c)
    x = _permute(x, (*range(n), n + 1, n + 3, n + 2, n + 4, n))
    x = x.reshape(*lead, grid_h * grid_w, patch_size * patch_size * channels)
    return np.ascontiguousarray(x) if isinstance(x, np.ndarray) else x


def unpatchify(patches: ArrayT, patch_size: int, height: int, width: int) -> ArrayT:
    """Inverse of `patchify`: `(..., (H/p)*(W/p), p*p*C)` patches back to `(..., C, H, W)` images."""
    patch_size = _check_patch_size(patch_size)
    if patches.ndim < 2:
        raise ValueError(
            f"Expected patches of shape (..., num_patches, patch_dim), got shape {tuple(patches.shape)}."
        )
    if height % patch_size or width % patch_size:
        raise ValueError(f"patch_size={patch_size} must divide height={height} and width={width}.")
    *lead, num_patches, patch_dim = (int(s) for s in patches.shape)
    grid_h, grid_w = height // patch_size, width // patch_size
    if num_patches != grid_h * grid_w or patch_dim % (patch_size * patch_size):
        raise ValueError(
            f"Patches of shape {tuple(patches.shape)} do not match a {height}x{width} image with "
            f"patch_size={patch_size} (expected {grid_h * grid_w} patches of size patch_size*patch_size*channels)."
        )
    channels = patch_dim // (patch_size * patch_size)
    n = len(lead)
    x = patches.reshape(*lead, grid_h, grid_w, patch_size, patch_size, channels)
    # (..., h, w, p1, p2, c) -> (..., c, h, p1, w, p2)
    x = _permute(x, (*range(n), n + 4, n, n + 2, n + 1, n + 3))
    x = x.reshape(*lead, channels, height, width)
    return np.ascontiguousarray(x) if isinstance(x, np.ndarray) else x


def _channel_axis(shape: tuple[int, ...], input_data_format: str | ChannelDimension | None) -> int:
    """Return the channel axis (0 or 2) of a 3-D image array, inferring it when no format is given."""
    if input_data_format is not None:
        return 0 if ChannelDimension(input_data_format) == ChannelDimension.FIRST else 2
    first_ok, last_ok = shape[0] in _CHANNEL_COUNTS, shape[-1] in _CHANNEL_COUNTS
    if first_ok and last_ok:
        # Ambiguous (e.g. (3, H, 3) or (4, W, 3)): prefer a gray/RGB axis over a 4-channel one, else channels-first.
        return 2 if shape[0] == 4 and shape[-1] != 4 else 0
    if first_ok:
        return 0
    if last_ok:
        return 2
    raise ValueError(
        f"Unsupported image shape {shape}: expected 1 (gray), 3 (RGB) or 4 (RGBA) channels on the first axis "
        "(C, H, W) or the last axis (H, W, C). Pass `input_data_format` if the layout is ambiguous."
    )


def _moveaxis(x: ArrayT, source: int, destination: int) -> ArrayT:
    """Move one axis of a numpy array or a torch tensor."""
    if isinstance(x, np.ndarray):
        return np.moveaxis(x, source, destination)
    return x.movedim(source, destination)


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
    image = _moveaxis(image, _channel_axis(shape, input_data_format), 0)
    if int(image.shape[0]) not in _CHANNEL_COUNTS:
        raise ValueError(
            f"Unsupported number of channels {int(image.shape[0])} for an image of shape {shape}: expected 1 "
            "(gray), 3 (RGB) or 4 (RGBA) channels."
        )
    return image


def _high_depth_to_float(image: PIL.Image.Image) -> np.ndarray:
    """A 16- or 32-bit integer or a float ("F") PIL image as a float32 (H, W) array on the 0..255 scale of uint8.

    Its range is that of the bit depth its brightest pixel needs (8, 10, 12, 14, 16 or 32 bits), or [0, 1] for a
    float image within it: a 12-bit image in a 16-bit file keeps its contrast, and floats are not rounded.
    """
    array = np.asarray(image, dtype=np.float64)
    if not np.isfinite(array).all():
        raise ValueError(
            f"PIL image in mode {image.mode!r} contains NaN or infinite values: expected finite pixels."
        )
    low, high = float(array.min()), float(array.max())
    if low < 0 or high > _DEPTH_MAXIMA[-1]:
        raise ValueError(
            f"PIL image in mode {image.mode!r} has values in [{low}, {high}]: expected values from 0 to at most "
            f"{_DEPTH_MAXIMA[-1]} (or floats in [0, 1]). Convert it to 8 bits (mode 'L' or 'RGB') yourself."
        )
    full = 1.0 if image.mode == "F" and high <= 1 else next(m for m in _DEPTH_MAXIMA if high <= m)
    return (array * (255.0 / full)).astype(np.float32)


def _pil_to_array(image: PIL.Image.Image, do_convert_rgb: bool | None) -> np.ndarray:
    """(H, W) or (H, W, C) array of a PIL image: RGB if do_convert_rgb, else its own channels if its mode allows.

    High-depth modes become float32 on the uint8 scale (see `_high_depth_to_float`), to be made RGB afterwards.
    """
    _check_has_pixels((image.height, image.width))
    if image.mode in _HIGH_DEPTH_MODES:
        return _high_depth_to_float(image)
    if do_convert_rgb:
        return convert_to_rgb(image, return_numpy=True)
    if image.mode in _PIL_MODES_WITHOUT_CONVERSION:
        return np.array(image)
    raise ValueError(
        f"PIL image in mode {image.mode!r} cannot be used with do_convert_rgb=False; expected one of "
        f"{_PIL_MODES_WITHOUT_CONVERSION} or set do_convert_rgb=True."
    )


def _numpy_to_rgb(image: np.ndarray, do_rescale: bool | None) -> np.ndarray:
    """A (C, H, W) array of 1, 3 or 4 channels as RGB: gray replicated, RGBA composited onto white."""
    if image.shape[0] == 4 and np.issubdtype(image.dtype, np.floating):
        # transformers' conversion takes float RGBA in [0, 1]; do_rescale=True means floats on the 0..255 scale.
        white = 255.0 if do_rescale else 1.0
        rgb = convert_to_rgb(image / white, input_data_format=ChannelDimension.FIRST, return_numpy=True)
        return np.ascontiguousarray(rgb * white)
    return np.ascontiguousarray(
        convert_to_rgb(image, input_data_format=ChannelDimension.FIRST, return_numpy=True)
    )


def _check_image_std(do_normalize: bool | None, image_std: Any) -> None:
    """Refuse an `image_std` of zero: normalizing divides by it (inf or NaN pixels)."""
    if do_normalize and image_std is not None and np.any(np.asarray(image_std, dtype=np.float64) == 0):
        raise ValueError(f"`image_std` must be non-zero (normalizing divides by it), got {image_std!r}.")


def _unsupported_image_type(image: Any) -> ValueError:
    return ValueError(
        f"Unsupported image type {type(image).__name__}: expected a PIL.Image.Image, numpy.ndarray or torch.Tensor."
    )


def _numel(image: Any) -> int:
    return int(image.size) if isinstance(image, np.ndarray) else image.numel()


def _is_float(image: Any) -> bool:
    if isinstance(image, np.ndarray):
        return bool(np.issubdtype(image.dtype, np.floating))
    return image.is_floating_point()


def _all_finite(image: Any) -> bool:
    return bool(np.isfinite(image).all() if isinstance(image, np.ndarray) else torch.isfinite(image).all())


def _check_pixel_values(images: list[Any], do_rescale: bool) -> None:
    """Refuse NaN or inf pixels; warn about inputs that `rescale_factor` would put outside the trained range."""
    for index, image in enumerate(images):
        if _is_float(image) and not _all_finite(image):
            raise ValueError(
                f"Image {index} contains NaN or infinite values: expected finite pixel values (0..255 for "
                "do_rescale=True, or already rescaled floats with do_rescale=False)."
            )
    if not do_rescale:
        return
    # uint8 images are in 0..255 by their dtype: no scan (on a GPU, each would be two host syncs per image).
    scanned = [image for image in images if _numel(image) and image.dtype not in (np.uint8, torch.uint8)]
    ranges = [(float(image.min()), float(image.max()), _is_float(image)) for image in scanned]
    if any(is_float and low >= 0 and 0 < high <= 1 for low, high, is_float in ranges):
        logger.warning_once(
            "It looks like you are rescaling float images already in [0, 1] (they are multiplied by "
            "rescale_factor=1/255 like uint8 images). If so, pass do_rescale=False."
        )
    if any(high > 255 for _, high, _ in ranges):
        logger.warning_once(
            "Some images have values above 255 (16-bit data?): they are multiplied by rescale_factor=1/255 "
            "like uint8 images and fall outside the trained range. Convert them to 8 bits, or set "
            "rescale_factor to 1 / (their maximum value)."
        )


def _check_stackable(pixel_values: list[Any], return_tensors: str | TensorType | None) -> None:
    sizes = sorted({tuple(int(s) for s in image.shape[-2:]) for image in pixel_values})
    if return_tensors is not None and len(sizes) > 1:
        raise ValueError(
            f"Images of different sizes {sizes} cannot be stacked into one tensor: keep do_resize=True (every "
            "image to `size`), or pass return_tensors=None for a list."
        )


def _flatten_images(images: Any) -> list[Any]:
    """Flatten a single image, a 4-D batch, or (nested) lists of images into a flat list of single images."""
    if isinstance(images, (PIL.Image.Image, str)):
        return [images]
    if is_valid_image(images):
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


class _NeuralInterpreterProcessing:
    """What both backends share: the defaults, the patch settings and their checks, and the input structure."""

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

    def __init__(
        self,
        do_resize: bool | None = None,
        size: dict[str, int] | int | None = None,
        resample: PILImageResampling | int | None = None,
        do_rescale: bool | None = None,
        rescale_factor: float | None = None,
        do_normalize: bool | None = None,
        image_mean: float | list[float] | None = None,
        image_std: float | list[float] | None = None,
        do_convert_rgb: bool | None = None,
        do_patchify: bool | None = None,
        patch_size: int | None = None,
        **kwargs: Unpack[NeuralInterpreterImageProcessorKwargs],
    ) -> None:
        """Build the processor; arguments left as None take the class defaults."""
        explicit = {
            "do_resize": do_resize,
            "size": size,
            "resample": resample,
            "do_rescale": do_rescale,
            "rescale_factor": rescale_factor,
            "do_normalize": do_normalize,
            "image_mean": image_mean,
            "image_std": image_std,
            "do_convert_rgb": do_convert_rgb,
            "do_patchify": do_patchify,
            "patch_size": patch_size,
        }
        kwargs.update({key: value for key, value in explicit.items() if value is not None})
        super().__init__(**kwargs)
        self._check_patch_config(self.do_resize, self.size, self.do_patchify, self.patch_size)
        _check_image_std(self.do_normalize, self.image_std)

    @staticmethod
    def _check_patch_config(
        do_resize: bool | None, size: SizeDict | None, do_patchify: bool | None, patch_size: Any
    ) -> None:
        """Raise a ValueError if the size/patch settings cannot produce a regular patch grid."""
        if do_resize and (size is None or not size.height or not size.width):
            raise ValueError(f"`size` must be a dict with 'height' and 'width' keys, got {size!r}.")
        if not do_patchify:
            return
        patch_size = _check_patch_size(patch_size)
        if do_resize and (size.height % patch_size or size.width % patch_size):
            raise ValueError(
                f"patch_size={patch_size} must divide the image size (height={size.height}, width={size.width})."
            )

    def _validate_preprocess_kwargs(self, **kwargs: Any) -> None:
        """Validate the preprocessing kwargs, including the patch settings."""
        super()._validate_preprocess_kwargs(**kwargs)
        _check_image_std(kwargs.get("do_normalize"), kwargs.get("image_std"))
        self._check_patch_config(
            kwargs.get("do_resize"), kwargs.get("size"), kwargs.get("do_patchify"), kwargs.get("patch_size")
        )

    def _prepare_images_structure(self, images: ImageInput, expected_ndims: int = 3) -> list[Any]:
        """Flatten the input into a list of single images, loading URLs/paths given as strings."""
        # Both backends decode files with PIL, as transformers' PIL backend does (RGB), so they read the same pixels.
        return [load_image(image) if isinstance(image, str) else image for image in _flatten_images(images)]

    def _preprocess(
        self,
        images: list[Any],
        do_rescale: bool,
        return_tensors: str | TensorType | None,
        do_patchify: bool | None = None,
        patch_size: int | None = None,
        **kwargs: Any,
    ) -> BatchFeature:
        """Resize, rescale and normalize the images (the backend's work), then optionally patchify."""
        _check_pixel_values(images, do_rescale)
        batch = super()._preprocess(images, do_rescale=do_rescale, return_tensors=None, **kwargs)
        pixel_values = [self._float32(image) for image in batch["pixel_values"]]
        _check_stackable(pixel_values, return_tensors)
        if do_patchify:
            pixel_values = [patchify(image, patch_size) for image in pixel_values]
        if return_tensors is not None:
            stack = np.stack if isinstance(pixel_values[0], np.ndarray) else torch.stack
            pixel_values = stack(pixel_values)
        return BatchFeature(data={"pixel_values": pixel_values}, tensor_type=return_tensors)

    def patchify(self, pixel_values: ArrayT, patch_size: int | None = None) -> ArrayT:
        """Patchify `(..., C, H, W)` images (numpy or torch) with `patch_size` (defaults to `self.patch_size`)."""
        return patchify(pixel_values, self.patch_size if patch_size is None else patch_size)

    def unpatchify(
        self,
        pixel_values: ArrayT,
        size: dict[str, int] | None = None,
        patch_size: int | None = None,
    ) -> ArrayT:
        """Turn patchified `pixel_values` (numpy or torch) back into `(..., C, H, W)` images of `size`."""
        size = self.size if size is None else SizeDict(**size)
        patch_size = self.patch_size if patch_size is None else patch_size
        return unpatchify(pixel_values, patch_size, size.height, size.width)


class NeuralInterpreterImageProcessor(_NeuralInterpreterProcessing, PilBackend):
    r"""Neural Interpreter image processor (PIL backend).

    Resizes to `size` (default 32x32, bilinear), converts to RGB (gray is replicated to 3 channels, PIL modes such as
    "P" or "RGBA" are converted, alpha being composited onto white), rescales by `rescale_factor` (1/255),
    normalizes with `image_mean`/`image_std` (0.5 each) and, if `do_patchify`, flattens each image into
    `pixel_values` of shape `(num_patches, patch_size * patch_size * 3)`: patches in row-major order over the grid,
    each patch laid out as (row in patch, column in patch, channel), i.e. einops
    `c (h p1) (w p2) -> (h w) (p1 p2 c)`. With `do_patchify=False`, `pixel_values` are `(3, H, W)` images.

    Float inputs are interpreted on the same scale as uint8 (0..255) and are multiplied by `rescale_factor`; pass
    `do_rescale=False` for float images already in [0, 1]. PIL images of more than 8 bits ("I;16", "I", "F") are
    scaled from the range of the bit depth their brightest pixel needs (8 to 16 or 32 bits; [0, 1] for a float
    image within it) to that uint8 scale, in float32. 4-channel arrays are composited onto white as transformers'
    `convert_to_rgb` does. With `do_convert_rgb=False` nothing is converted: an image keeps its 1, 3 or 4 channels
    (give `image_mean`/`image_std` per channel). Images without pixels and an `image_std` of 0 are refused.
    """

    def process_image(
        self,
        image: ImageInput,
        do_convert_rgb: bool | None = None,
        input_data_format: str | ChannelDimension | None = None,
        do_rescale: bool | None = None,
        **kwargs: Any,
    ) -> np.ndarray:
        """Convert one PIL image, numpy array or torch tensor into a (C, H, W) numpy array (C = 3 if do_convert_rgb)."""
        if isinstance(image, PIL.Image.Image):
            image, input_data_format = _pil_to_array(image, do_convert_rgb), ChannelDimension.LAST
        elif is_torch_tensor(image):
            tensor = image.detach().cpu()
            if tensor.is_floating_point() and tensor.dtype.itemsize < 4:
                tensor = tensor.float()  # numpy has no bfloat16
            image = tensor.numpy()
        if not isinstance(image, np.ndarray):
            raise _unsupported_image_type(image)
        if image.dtype == np.bool_:
            image = image.astype(np.uint8) * 255  # a binary image: True is white, as PIL's mode "1"
        image = _to_channels_first(image, input_data_format)
        return _numpy_to_rgb(image, do_rescale) if do_convert_rgb else np.ascontiguousarray(image)

    def resize(
        self,
        image: np.ndarray,
        size: SizeDict,
        resample: PILImageResampling | int | None = None,
        reducing_gap: int | None = None,
        **kwargs: Any,
    ) -> np.ndarray:
        """Resize a (C, H, W) image with PIL; uint8 images as RGB, other dtypes per channel in float32."""
        if image.shape[-2:] == (size.height, size.width):
            return image
        if image.dtype == np.uint8:
            return super().resize(image, size, resample=resample, reducing_gap=reducing_gap, **kwargs)
        resample = PILImageResampling.BILINEAR if resample is None else resample
        channels = [
            np.asarray(
                PIL.Image.fromarray(np.ascontiguousarray(channel, dtype=np.float32)).resize(
                    (size.width, size.height), resample=resample, reducing_gap=reducing_gap
                )
            )
            for channel in image
        ]
        return np.stack(channels, axis=0)

    @staticmethod
    def _float32(image: np.ndarray) -> np.ndarray:
        return np.asarray(image, dtype=np.float32)


class NeuralInterpreterImageProcessorTorchvision(_NeuralInterpreterProcessing, TorchvisionBackend):
    r"""Neural Interpreter image processor (torchvision backend): the processing of `NeuralInterpreterImageProcessor`
    as batched torch operations, on the device given by `device=` (the input's by default, CPU for PIL and numpy).

    Same arguments, inputs, errors and saved `preprocessor_config.json` as the PIL processor; `AutoImageProcessor`
    returns this one where torchvision is installed (`backend="pil"` asks for the other). The values agree: images
    already of `size` or resized up (the 8 x 8 and 28 x 28 digits) get the same uint8 pixels, images resized down
    differ by one grey level at most (the two antialiasing filters round differently), and rescaling and normalizing
    round apart by about 1e-7 (tests/test_image_processing.py). Without `return_tensors`, `pixel_values` is a list of
    torch tensors (the PIL processor's, of numpy arrays).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Build the processor (see `NeuralInterpreterImageProcessor`); needs torchvision."""
        if not is_torchvision_available():
            raise ImportError(
                "NeuralInterpreterImageProcessorTorchvision needs torchvision (pip install torchvision, the build "
                "that matches your torch); without it, use NeuralInterpreterImageProcessor (the PIL backend), which "
                "AutoImageProcessor picks by itself."
            )
        super().__init__(*args, **kwargs)

    def process_image(
        self,
        image: ImageInput,
        do_convert_rgb: bool | None = None,
        input_data_format: str | ChannelDimension | None = None,
        device: torch.device | str | None = None,
        do_rescale: bool | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """Convert one PIL image, numpy array or torch tensor into a (C, H, W) tensor: uint8, else float32."""
        if isinstance(image, PIL.Image.Image):
            image, input_data_format = _pil_to_array(image, do_convert_rgb), ChannelDimension.LAST
        if isinstance(image, np.ndarray):
            if image.dtype == np.bool_:
                image = image.astype(np.uint8) * 255  # a binary image: True is white, as PIL's mode "1"
            image = _to_channels_first(image, input_data_format)
            image = _numpy_to_rgb(image, do_rescale) if do_convert_rgb else image
            # Every dtype but uint8 is resized in float32, as the PIL processor does (torch has few uint16 kernels).
            image = torch.from_numpy(
                np.ascontiguousarray(image if image.dtype == np.uint8 else image.astype(np.float32))
            )
        elif is_torch_tensor(image):
            image = image.detach()
            if image.dtype == torch.bool:
                image = image.to(torch.uint8) * 255
            image = _to_channels_first(image, input_data_format)
            if image.dtype != torch.uint8:
                image = image.to(torch.float32)
            if do_convert_rgb and image.shape[0] == 1:
                image = image.expand(3, -1, -1)
            elif do_convert_rgb and image.shape[0] == 4 and image.dtype == torch.uint8:
                image = self.convert_to_rgb(image, input_data_format=ChannelDimension.FIRST)
            elif do_convert_rgb and image.shape[0] == 4:
                # transformers' conversion takes float RGBA in [0, 1]; do_rescale=True means the 0..255 scale.
                white = 255.0 if do_rescale else 1.0
                image = self.convert_to_rgb(image / white, input_data_format=ChannelDimension.FIRST) * white
        else:
            raise _unsupported_image_type(image)
        image = image.contiguous()
        return image if device is None else image.to(device)

    def resize(
        self,
        image: torch.Tensor,
        size: SizeDict,
        resample: PILImageResampling | int | None = None,
        antialias: bool = True,
        **kwargs: Any,
    ) -> torch.Tensor:
        """Resize (..., C, H, W) images with torchvision (antialiased, as PIL), unless they already have `size`."""
        if tuple(image.shape[-2:]) == (size.height, size.width):
            return image
        return super().resize(image, size, resample=resample, antialias=antialias, **kwargs)

    @staticmethod
    def _float32(image: torch.Tensor) -> torch.Tensor:
        return image.to(torch.float32)

    def save_pretrained(
        self, save_directory: str | Any, push_to_hub: bool = False, **kwargs: Any
    ) -> list[str]:
        """Save what the PIL processor saves (its type, its `auto_map`), so the folder loads with either backend."""
        settings = {key: value for key, value in self.to_dict().items() if key != "image_processor_type"}
        pil = NeuralInterpreterImageProcessor(**settings)
        return pil.save_pretrained(save_directory, push_to_hub=push_to_hub, **kwargs)


__all__ = [
    "NeuralInterpreterImageProcessor",
    "NeuralInterpreterImageProcessorTorchvision",
    "patchify",
    "unpatchify",
]
