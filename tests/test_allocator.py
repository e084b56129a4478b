import platform
import subprocess
import sys

import pytest

from smoothsk import cli
from smoothsk.allocator import keep_freed_memory

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc policy")

#: Page faults of ten forward-pass-like rounds of 48 MB buffers (above glibc's largest adaptive mmap
#: threshold, 32 MB on 64-bit systems) after two warm-up rounds, first at glibc's defaults, then after
#: keep_freed_memory (in one fresh interpreter: the first count is taken before anything changes malloc).
PROBE = """
import resource, torch
from smoothsk.allocator import keep_freed_memory

def round_():
    buffer = torch.empty(12 * 1024 * 1024)  # 48 MB of float32
    buffer.fill_(1.0)  # touch every page
    del buffer

def faults_of_ten_rounds():
    round_()
    round_()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        round_()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

default = faults_of_ten_rounds()
changed = keep_freed_memory()
print(default, changed, faults_of_ten_rounds())
"""


@glibc_only
def test_freed_buffers_are_reused_instead_of_faulted_in_again():
    pages = 48 * 1024 * 1024 // 4096
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    default, changed, kept = result.stdout.split()
    assert int(default) >= 10 * pages  # every round maps and faults its buffer afresh
    # The warm-up rounds' memory serves the ten rounds (glibc may fault a buffer in once or twice more while
    # its heap settles: 2 buffers and 1 page once, on a loaded machine): under a third of the default's faults.
    assert changed == "True" and int(kept) <= 3 * pages


@glibc_only
@pytest.mark.parametrize("name, value", [("MALLOC_TRIM_THRESHOLD_", "131072"),
                                         ("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=131072")])
def test_a_users_own_malloc_settings_are_kept(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    assert keep_freed_memory() is False


def test_the_command_keeps_freed_memory_and_main_does_not(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(cli, "keep_freed_memory", lambda: calls.append(True))
    arguments = ["certify", str(tmp_path / "missing.safetensors"), str(tmp_path / "missing.npz"),
                 "--out", str(tmp_path / "out.csv")]
    assert cli.main(arguments) == 2 and calls == []
    monkeypatch.setattr(sys, "argv", ["smoothsk", *arguments])
    assert cli.console_script() == 2 and calls == [True]


class FakeMallopt:
    """glibc's mallopt that refuses mmap thresholds above ``mmap_limit``; records (parameter, value) calls."""

    def __init__(self, mmap_limit):
        self.mmap_limit, self.calls, self.argtypes = mmap_limit, [], None

    def __call__(self, parameter, value):
        self.calls.append((parameter, value))
        return int(parameter != -3 or value <= self.mmap_limit)


@glibc_only
@pytest.mark.parametrize("mmap_limit, expected", [
    (1 << 30, ([(-3, 1 << 30), (-1, 1 << 30)], True)),  # glibc 2.35 and later
    (32 << 20, ([(-3, 1 << 30), (-3, 32 << 20), (-1, 1 << 30)], True)),  # older glibc: at most 32 MiB
    (0, ([(-3, 1 << 30), (-3, 32 << 20)], False)),  # refused: the trim threshold is left alone
])
def test_the_mmap_threshold_is_set_first_and_the_trim_threshold_only_after_it(monkeypatch, mmap_limit, expected):
    # Setting either threshold switches off glibc's adaptive mmap threshold: a trim threshold set alone
    # would leave every buffer over 128 KiB mapped afresh, slower than the defaults.
    fake = FakeMallopt(mmap_limit)
    monkeypatch.setattr("smoothsk.allocator.ctypes.CDLL", lambda name: type("Libc", (), {"mallopt": fake}))
    for name in ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES"):
        monkeypatch.delenv(name, raising=False)
    calls, changed = expected
    assert keep_freed_memory() is changed and fake.calls == calls
