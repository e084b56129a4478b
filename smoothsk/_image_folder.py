"""A folder of images, one sub-folder per class (torchvision's ``ImageFolder`` layout), read as a Dataset.

``root/<class>/.../<image>``: every PNG or JPEG file (``.png``, ``.jpg``,
``.jpeg``, any case) under a class folder, found recursively, is an input
whose label is the class folder's name; classes and files are in sorted
order, and files directly in ``root`` or of other types are ignored (as
torchvision does). A label is an int where every class name is one written
plainly (``0``, ``7``, ``-1``; not ``07``) that fits an int64, so that folders named after the
classes of a model trained on integer labels match them; else the name.

An image may be hostile. Listing the folder reads no image, follows no
link to a folder, recurses at no depth, and refuses a class folder whose name
is not UTF-8 (its label could not be written). Each image is read when its
input is: opened once, checked through that descriptor to be a regular file
(not a device or a pipe) of at most 16 times the raw pixels of one input (1
MiB for small inputs), and read into memory, so that Pillow reads bytes the
file holds and nothing a chunk only declares. Its header must then say a PNG
or a JPEG by its content, whatever its name, of 8 bits per channel, and
exactly the model's width and height. Only then is it decoded, so decoding
allocates no more than one input of the model's size (and Pillow's own
bounds on metadata). Any other file is refused with a ``ValueError`` naming
it.

An image becomes the float32 input ``(C, H, W)`` in [0, 1], its 8-bit values
divided by 255 (as torchvision's ``ToTensor``), converted to grey (``C = 1``)
or RGB (``C = 3``) as the model's input shape says; an alpha channel is dropped.
"""

import io
import math
import os
import re
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from ._regular_file import read_regular_file

__all__ = ["IMAGE_SUFFIXES", "ImageFolder"]

#: File name endings read as images (compared in lower case).
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
#: Pillow's image formats read; a file of another format is refused whatever its name.
_FORMATS = ("PNG", "JPEG")
#: Pillow modes of 8 bits per channel, converted to grey or RGB; others (16-bit, float) are refused.
_EIGHT_BIT_MODES = ("1", "L", "LA", "P", "PA", "RGB", "RGBA", "RGBa", "RGBX", "CMYK", "YCbCr")
#: Pillow's mode for the number of channels of the model's inputs.
_MODE_OF_CHANNELS = {1: "L", 3: "RGB"}
#: A class name read as an int label (when every name is one, of int64).
_PLAIN_INT = re.compile(r"0|-?[1-9][0-9]*")


class ImageFolder:
    """The images under ``root``, one sub-folder per class, each read and checked when indexed.

    Parameters
    ----------
    root : str or Path
        The folder of class folders.
    input_shape : tuple of int
        The model's input shape, ``(C, H, W)`` with ``C`` 1 or 3: every
        image must be ``W`` x ``H`` pixels.

    Attributes
    ----------
    files : list of Path
        The images, by class, then path.
    labels : ndarray, shape (n_images,)
        The class of each image: ints where every class name is one, else strings.
    classes : list of str
        The class folders' names, sorted.
    shape : tuple of int
        ``(n_images, C, H, W)``.

    Raises
    ------
    ValueError
        Naming the folder: not a folder, an input shape that is not an
        image's, no class folder, a class folder without images or whose name
        is not UTF-8.
    """

    def __init__(self, root, input_shape):
        root, input_shape = Path(root), tuple(input_shape)
        if len(input_shape) != 3 or input_shape[0] not in _MODE_OF_CHANNELS:
            raise ValueError(f"{root}: a folder of images gives inputs of shape (channels, height, width) with 1 or 3 "
                             f"channels, but the model takes inputs of shape {input_shape}.")
        self.root, self.input_shape = root, input_shape
        try:
            self.classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir(follow_symlinks=False))
        except OSError as error:
            raise ValueError(f"{root}: cannot list it as a folder of class folders ({error.strerror or error}).") \
                from error
        if not self.classes:
            raise ValueError(f"{root}: no class folder in it; put each class's images in a folder named after it "
                             f"(e.g. {root}/cat/1.png).")
        for name in self.classes:
            if not _is_utf_8(name):  # its label could be neither written to a CSV nor printed
                raise ValueError(f"{_printable(root / name)}: a class folder whose name is not UTF-8; rename it.")
        self.files, names = [], []
        for name in self.classes:
            images = sorted(_images_under(root / name))
            if not images:
                raise ValueError(f"{root / name}: a class folder without images (files ending in "
                                 f"{', '.join(IMAGE_SUFFIXES)}).")
            self.files += images
            names += [name] * len(images)
        plain = all(_PLAIN_INT.fullmatch(name) and -2**63 <= int(name) < 2**63 for name in self.classes)
        self.labels = np.array([int(name) for name in names] if plain else names)
        self.shape = (len(self.files),) + input_shape

    def __len__(self):
        return len(self.files)

    def __getitem__(self, index):
        """Image ``index`` as a float32 input ``(C, H, W)`` in [0, 1]; a ``ValueError`` naming a bad file."""
        path = self.files[index]
        channels, height, width = self.input_shape
        try:
            # Pillow reads from memory: a chunk declaring more bytes than the file holds gets what it holds.
            content = read_regular_file(path, _largest_file(self.input_shape))
            # Pillow warns of an image between its bomb limit and twice it (on stderr, two lines): the size
            # check below refuses it in one line, as any image not of the model's size.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                image = Image.open(io.BytesIO(content), formats=_FORMATS)  # reads the header only
            with image:
                if image.mode not in _EIGHT_BIT_MODES:
                    raise ValueError(f"mode {image.mode}, not 8 bits per channel")
                if image.size != (width, height):
                    raise ValueError(f"{image.size[0]}x{image.size[1]} pixels, but the model takes {width}x{height}")
                pixels = np.asarray(image.convert(_MODE_OF_CHANNELS[channels]), dtype=np.float32)
        except UnidentifiedImageError as error:
            raise ValueError(f"{path}: not a PNG or JPEG image Pillow can read.") from error
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:
            reason = getattr(error, "strerror", None) or " ".join(str(error).split())
            raise ValueError(f"{path}: {reason}.") from error
        return (pixels / 255).reshape(height, width, channels).transpose(2, 0, 1)


def _largest_file(input_shape):
    """Bytes an image file of ``input_shape`` may take: its raw pixels 16 times, and 1 MiB for small images.

    A PNG or JPEG of 8-bit pixels compresses them; this leaves room for
    metadata (an ICC profile, text) and for incompressible noise.
    """
    return max(16 * math.prod(input_shape), 1 << 20)


def _is_utf_8(name):
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # the file system's bytes, decoded with surrogates
        return False
    return True


def _printable(path):
    """``path`` with the bytes that are not UTF-8 written as escapes."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _images_under(folder):
    """The image files under ``folder``, recursively, without following links to folders.

    Walked with a stack, not by recursion, so that no depth of folders raises a ``RecursionError``.
    """
    folders = [folder]
    while folders:
        parent = folders.pop()
        try:
            entries = list(os.scandir(parent))
        except OSError as error:
            raise ValueError(f"{_printable(parent)}: cannot list it ({error.strerror or error}).") from error
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                folders.append(Path(entry.path))
            elif entry.name.lower().endswith(IMAGE_SUFFIXES) and not _links_to_folder(entry):
                yield Path(entry.path)


def _links_to_folder(entry):
    """Whether a directory entry that is no folder itself is a link to one (neither image nor followed).

    A link that cannot be followed (dangling, a loop) is not: it is listed,
    and refused naming it when it is read.
    """
    try:
        return entry.is_dir()
    except OSError:
        return False
