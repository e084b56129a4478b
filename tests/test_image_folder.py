"""A folder of class folders of images, read as a Dataset: layout, labels, pixel values, hostile files."""

import io
import os
import sys
import tracemalloc
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from smoothsk._image_folder import ImageFolder

from conftest import forbid


def save(path, pixels, image_format="PNG", mode=None):
    """Write ``pixels`` (uint8, (H, W) or (H, W, C)) as an image file at ``path``, its folders made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels, mode).save(path, image_format)


@pytest.fixture
def grey(tmp_path):
    """Six 4x3 grey PNGs in class folders ``1`` and ``10`` (one nested), a text file and an image at the root."""
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(6, 3, 4), dtype=np.uint8)
    for index, name in enumerate(["10/b.png", "10/a.PNG", "1/c.png", "1/sub/d.png", "1/e.png", "1/f.png"]):
        save(tmp_path / name, pixels[index])
    (tmp_path / "1" / "notes.txt").write_text("not an image")
    save(tmp_path / "stray.png", pixels[0])
    return tmp_path, pixels


class TestLayout:
    def test_classes_and_files_are_sorted_and_labels_are_ints_for_integer_names(self, grey):
        root, _ = grey
        images = ImageFolder(root, (1, 3, 4))
        assert images.classes == ["1", "10"]
        assert [path.relative_to(root).as_posix() for path in images.files] == [
            "1/c.png", "1/e.png", "1/f.png", "1/sub/d.png", "10/a.PNG", "10/b.png"]
        assert images.labels.tolist() == [1, 1, 1, 1, 10, 10] and images.labels.dtype.kind == "i"
        assert len(images) == 6 and images.shape == (6, 1, 3, 4)

    @pytest.mark.parametrize("names, labels", [(["cat", "dog"], ["cat", "dog"]), (["07", "8"], ["07", "8"]),
                                               (["-1", "0"], [-1, 0]), (["-0", "0"], ["-0", "0"]),
                                               # Past int64: the labels were float64 (1 became 1.0), or objects.
                                               (["1", str(2**64 - 1)], ["1", str(2**64 - 1)]),
                                               (["1", str(10**20)], ["1", str(10**20)])])
    def test_labels_are_the_names_unless_every_name_is_a_plain_int(self, tmp_path, names, labels):
        for name in names:
            save(tmp_path / name / "x.png", np.zeros((2, 2), np.uint8))
        found = ImageFolder(tmp_path, (1, 2, 2)).labels
        assert found.tolist() == labels and found.dtype.kind == ("i" if isinstance(labels[0], int) else "U")

    def test_a_folder_deeper_than_pythons_recursion_limit_is_listed(self, tmp_path):
        # 300 folders deep under a recursion limit of 250 (the default 1,000 would also bind pytest's clean-up,
        # which removes folders by recursion).
        deep = tmp_path / "a" / os.path.join(*["d"] * 300)
        save(deep / "x.png", np.zeros((2, 2), np.uint8))
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(250)
        try:
            files = ImageFolder(tmp_path, (1, 2, 2)).files
        finally:
            sys.setrecursionlimit(limit)
        assert files == [deep / "x.png"]

    def test_a_class_name_that_is_not_utf_8_is_refused_before_any_image_is_read(self, tmp_path):
        # Its label could not be written to a CSV (or printed): refused when listing, not after certifying.
        os.mkdir(os.path.join(os.fsencode(tmp_path), b"caf\xe9"))
        save(Path(os.fsdecode(os.path.join(os.fsencode(tmp_path), b"caf\xe9"))) / "x.png", np.zeros((2, 2), np.uint8))
        with pytest.raises(ValueError, match=r"caf\\xe9: a class folder whose name is not UTF-8") as error:
            ImageFolder(tmp_path, (1, 2, 2))
        str(error.value).encode("utf-8")  # the message itself can be printed

    def test_a_linked_folder_is_not_followed(self, grey, tmp_path_factory):
        root, pixels = grey
        elsewhere = tmp_path_factory.mktemp("elsewhere")
        save(elsewhere / "g.png", pixels[0])
        os.symlink(elsewhere, root / "1" / "link")
        os.symlink(elsewhere, root / "1" / "link.png")  # named as an image: neither an image nor a folder to walk
        os.symlink(elsewhere, root / "linked-class")
        assert len(ImageFolder(root, (1, 3, 4))) == 6

    @pytest.mark.parametrize("make, message", [
        (lambda root: None, r"no class folder in it"),
        (lambda root: (root / "empty").mkdir(), r"empty: a class folder without images"),
        (lambda root: (root / "a").mkdir() or (root / "a" / "x.txt").write_text(""), r"a class folder without images"),
    ], ids=["no class", "empty class", "no image"])
    def test_a_folder_without_images_is_refused(self, tmp_path, make, message):
        make(tmp_path)
        with pytest.raises(ValueError, match=message):
            ImageFolder(tmp_path, (1, 2, 2))

    def test_not_a_folder_and_input_shapes_that_are_not_images_are_refused(self, grey):
        root, _ = grey
        with pytest.raises(ValueError, match="cannot list it as a folder"):
            ImageFolder(root / "stray.png", (1, 3, 4))
        for shape in [(12,), (2, 3, 4), (1, 1, 3, 4)]:
            with pytest.raises(ValueError, match=r"1 or 3 channels, but the model takes inputs of shape"):
                ImageFolder(root, shape)


class TestPixels:
    def test_grey_pixels_are_floats_in_0_1(self, grey):
        root, pixels = grey
        x = ImageFolder(root, (1, 3, 4))[0]  # 1/c.png
        assert x.dtype == np.float32 and x.shape == (1, 3, 4)
        np.testing.assert_array_equal(x[0], pixels[2].astype(np.float32) / 255)

    def test_rgb_alpha_and_palette_images_become_rgb_channels_first(self, tmp_path):
        rgba = np.random.default_rng(1).integers(0, 256, size=(3, 4, 4), dtype=np.uint8)
        save(tmp_path / "a" / "rgba.png", rgba)
        Image.fromarray(rgba[:, :, :3]).convert("P").save(tmp_path / "a" / "palette.png")
        images = ImageFolder(tmp_path, (3, 3, 4))
        np.testing.assert_array_equal(images[1], rgba[:, :, :3].transpose(2, 0, 1).astype(np.float32) / 255)
        palette = np.asarray(Image.open(tmp_path / "a" / "palette.png").convert("RGB"))
        np.testing.assert_array_equal(images[0], palette.transpose(2, 0, 1).astype(np.float32) / 255)

    def test_a_jpeg_is_read_as_its_decoded_pixels(self, tmp_path):
        save(tmp_path / "a" / "x.jpg", np.full((8, 8, 3), 200, np.uint8), "JPEG")
        x = ImageFolder(tmp_path, (1, 8, 8))[0]
        assert x.shape == (1, 8, 8) and np.abs(x - 200 / 255).max() < 0.02


class TestHostileFiles:
    def test_an_image_of_another_size_is_refused_before_it_is_decoded(self, grey, monkeypatch):
        root, _ = grey
        images = ImageFolder(root, (1, 30, 40))
        forbid(monkeypatch, Image.Image, "convert", "decoded an image of the wrong size")
        with pytest.raises(ValueError, match=r"1/c.png: 4x3 pixels, but the model takes 40x30\.$"):
            images[0]

    def test_a_decompression_bomb_is_refused_from_its_header(self, tmp_path, monkeypatch):
        save(tmp_path / "a" / "big.png", np.zeros((64, 64), np.uint8))
        monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # 64x64 is a bomb at this limit
        forbid(monkeypatch, Image.Image, "convert", "decoded a bomb")
        with pytest.raises(ValueError, match=r"big.png: Image size \(4096 pixels\) exceeds limit"):
            ImageFolder(tmp_path, (1, 64, 64))[0]

    def test_an_image_near_pillow_s_bomb_limit_is_refused_by_its_size_without_a_warning(self, tmp_path, monkeypatch):
        # Between Pillow's limit and twice it, Pillow warned on stderr (two lines) before the refusal.
        save(tmp_path / "a" / "big.png", np.zeros((64, 64), np.uint8))
        monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 3000)  # 4096 pixels: a warning at this limit
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(ValueError, match=r"big.png: 64x64 pixels, but the model takes 8x8"):
                ImageFolder(tmp_path, (1, 8, 8))[0]

    @pytest.mark.parametrize("write, message", [
        (lambda path: path.write_bytes(b"not an image at all"), r"not a PNG or JPEG image Pillow can read"),
        (lambda path: Image.new("L", (4, 3)).save(path, "TIFF"), r"not a PNG or JPEG image Pillow can read"),
        (lambda path: Image.new("I;16", (4, 3)).save(path, "PNG"), r"mode I;16, not 8 bits per channel"),
        (lambda path: os.mkfifo(path), r"not a regular file"),
    ], ids=["garbage", "tiff named png", "16 bits", "fifo"])
    def test_files_that_are_not_8_bit_png_or_jpeg_are_refused_naming_them(self, tmp_path, write, message):
        path = tmp_path / "a" / "x.png"
        path.parent.mkdir()
        write(path)
        with pytest.raises(ValueError, match=rf"{path}: {message}") as error:
            ImageFolder(tmp_path, (1, 3, 4))[0]
        assert "\n" not in str(error.value)

    def test_a_chunk_longer_than_the_file_allocates_no_more_than_the_file(self, tmp_path):
        # An 8x8 PNG whose IDAT chunk declares 0xF0000000 bytes: Pillow asks for that many in one read.
        buffer = io.BytesIO()
        Image.fromarray(np.zeros((8, 8), np.uint8)).save(buffer, "PNG")
        content = bytearray(buffer.getvalue())
        length = content.find(b"IDAT") - 4
        content[length:length + 4] = (0xF0000000).to_bytes(4, "big")
        path = tmp_path / "a" / "x.png"
        path.parent.mkdir()
        path.write_bytes(bytes(content))
        images = ImageFolder(tmp_path, (1, 8, 8))
        tracemalloc.start()
        try:
            images[0]
        except ValueError as error:
            assert str(error).startswith(f"{path}: ")
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        assert peak < 1 << 20, peak

    def test_a_link_loop_named_as_an_image_is_listed_then_refused_when_read_naming_it(self, tmp_path):
        save(tmp_path / "a" / "x.png", np.zeros((2, 2), np.uint8))
        (tmp_path / "a" / "y.png").symlink_to("y.png")
        images = ImageFolder(tmp_path, (1, 2, 2))
        assert [path.name for path in images.files] == ["x.png", "y.png"]
        with pytest.raises(ValueError, match=r"y\.png: Too many levels of symbolic links\.$"):
            images[1]

    def test_a_file_larger_than_an_image_of_the_models_size_is_refused_before_it_is_read(self, tmp_path):
        # A valid 2x2 PNG followed by 2 MiB of other bytes: over the 1 MiB a small image's file may take.
        buffer = io.BytesIO()
        Image.fromarray(np.zeros((2, 2), np.uint8)).save(buffer, "PNG")
        path = tmp_path / "a" / "x.png"
        path.parent.mkdir()
        path.write_bytes(buffer.getvalue() + bytes(2 << 20))
        images = ImageFolder(tmp_path, (1, 2, 2))
        tracemalloc.start()
        try:
            with pytest.raises(ValueError, match="bytes, more than the 1048576 a file of its kind may take") as error:
                images[0]
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        assert str(error.value).startswith(f"{path}: ") and peak < 1 << 20, peak

    @pytest.mark.parametrize("image_format", ["PNG", "JPEG"])
    def test_any_damaged_byte_is_read_or_refused_with_a_value_error(self, tmp_path, image_format):
        buffer = io.BytesIO()
        Image.fromarray(np.random.default_rng(0).integers(0, 256, (4, 4, 3), dtype=np.uint8)).save(buffer, image_format)
        content, path = buffer.getvalue(), tmp_path / "a" / "x.png"
        path.parent.mkdir()
        path.write_bytes(content)
        images = ImageFolder(tmp_path, (3, 4, 4))
        for index in range(len(content)):
            path.write_bytes(content[:index] + bytes([content[index] ^ 0xFF]) + content[index + 1:])
            try:
                x = images[0]
            except ValueError as error:
                assert str(error).startswith(f"{path}: ") and "\n" not in str(error), index
            else:
                assert x.shape == (3, 4, 4) and ((x >= 0) & (x <= 1)).all(), index
