"""GPU certification: seconds per CIFAR-10 image at n = 100,000, smoothsk against Cohen et al.'s loop.

The model is ``CifarResNet(blocks=18)`` (ResNet-110, Cohen et al.'s CIFAR-10
base classifier) on CIFAR-shaped inputs (3x32x32 in [0, 1]). Its weights are
random: the time of certification does not depend on them (every noisy copy
goes through the whole network whatever it predicts). Two ways to certify
the same inputs with the same sample sizes (n0 = 100 selection, n estimation
samples each), in float32 and under ``torch.autocast`` in bfloat16:

- ``smoothsk``: ``SampleWiseSmoothedClassifier.certify`` (noise drawn and
  counts reduced on the device, batches packed across inputs,
  ``channels_last``, ``certify_autocast``);
- ``per-input loop``: Cohen et al.'s ``Smooth.certify`` (``core.py``)
  written plainly: per input, batches of copies of that one input, noise from
  ``torch.randn_like``, predictions counted on the host.

Targets: < 1 s per image at n = 100,000 with bf16 on one
H100-class GPU (Cohen et al. report 14-17 s on a 1080 Ti); smoothsk >= 2x the
per-input loop at n <= 1,000, where batches of one input's copies are small.

Run ``python benchmarks/bench_gpu.py`` on a machine with CUDA (it prints a
message and exits where there is none), or ``benchmarks/gpu_check.sh``, which
runs it with the other GPU checks; ``--device cpu --n 200 --inputs 2
--blocks 1`` is a smoke run of the script on a CPU.
"""

import argparse
import sys
import time

import numpy as np
import torch
from scipy import stats
from torch.fx.experimental.optimization import fuse

from smoothsk import SampleWiseSmoothedClassifier
from smoothsk.models import CifarResNet
from smoothsk.sampling import FixedSampler
from smoothsk.sigma import FixedSigma

from _common import table_header, table_row
from bench_certify import in_layout

SIGMA = 0.25
ALPHA = 0.001
N0 = 100
N_CLASSES = 10


class CohenSmooth:
    """Cohen et al.'s ``Smooth`` (core.py): CERTIFY one input at a time.

    Parameters
    ----------
    module : torch.nn.Module
        Base classifier, in eval mode on ``device``.
    sigma : float
    device : torch.device
    autocast : torch.dtype or None
        Forward passes under ``torch.autocast`` in this dtype.
    """

    ABSTAIN = -1

    def __init__(self, module, sigma, device, autocast=None):
        self.module, self.sigma, self.device, self.autocast = module, sigma, device, autocast

    def certify(self, x, n0, n, alpha, batch_size):
        """(prediction, radius) of one input ``x`` of shape (3, 32, 32), as Cohen et al.'s CERTIFY."""
        counts_selection = self._sample_noise(x, n0, batch_size)
        candidate = int(counts_selection.argmax())
        counts_estimation = self._sample_noise(x, n, batch_size)
        n_candidate = int(counts_estimation[candidate])
        # Clopper-Pearson lower bound at level 1 - alpha (statsmodels' proportion_confint, method="beta").
        p_lower = stats.beta.ppf(alpha, n_candidate, n - n_candidate + 1) if n_candidate else 0.0
        if p_lower < 0.5:
            return self.ABSTAIN, 0.0
        return candidate, self.sigma * stats.norm.ppf(p_lower)

    def _sample_noise(self, x, num, batch_size):
        with torch.no_grad(), torch.autocast(self.device.type, dtype=self.autocast, enabled=self.autocast is not None):
            counts = np.zeros(N_CLASSES, dtype=int)
            remaining = num
            while remaining:
                this_batch_size = min(batch_size, remaining)
                remaining -= this_batch_size
                batch = x.repeat((this_batch_size, 1, 1, 1))
                noise = torch.randn_like(batch, device=self.device) * self.sigma
                predictions = self.module(batch + noise).argmax(1)
                counts += self._count_arr(predictions.cpu().numpy(), N_CLASSES)
            return counts

    @staticmethod
    def _count_arr(arr, length):
        counts = np.zeros(length, dtype=int)
        for idx in arr:
            counts[idx] += 1
        return counts


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_smoothsk(X, n, blocks, batch_size, device, precision, fuse_batch_norm=False):
    """Seconds to certify X with ``SampleWiseSmoothedClassifier.certify`` (after a warm-up input), and its module.

    ``fuse_batch_norm`` folds each batch normalisation into the convolution
    before it (``torch.fx.experimental.optimization.fuse``: the same function
    in eval mode, one pass over the activations fewer per layer).
    """
    torch.manual_seed(0)
    module = CifarResNet(blocks=blocks).eval()
    if fuse_batch_norm:
        module = fuse(module)
    clf = SampleWiseSmoothedClassifier.from_module(
        module, input_shape=X.shape[1:], sigma=SIGMA, sigma_search=FixedSigma(SIGMA),
        sampler=FixedSampler(n=n, n0=N0), alpha=ALPHA, certify_batch_size=batch_size, device=str(device),
        certify_autocast=None if precision == "fp32" else "bfloat16", random_state=0)
    clf.certify(X[:1])
    synchronize(device)
    start = time.perf_counter()
    clf.certify(X)
    synchronize(device)
    return time.perf_counter() - start, clf.module_


def time_loop(module, X, n, batch_size, device, precision):
    """Seconds to certify X with Cohen et al.'s per-input loop (after a warm-up input)."""
    # A contiguous copy, as Cohen et al.'s code runs: certify converts module_ to channels_last in place.
    module = in_layout(module, X, torch.contiguous_format)[0].eval()
    smooth = CohenSmooth(module, SIGMA, device, None if precision == "fp32" else torch.bfloat16)
    inputs = torch.from_numpy(X).to(device)
    smooth.certify(inputs[0], N0, min(n, 1000), ALPHA, batch_size)
    synchronize(device)
    start = time.perf_counter()
    for x in inputs:
        smooth.certify(x, N0, n, ALPHA, batch_size)
    synchronize(device)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="torch device (default cuda)")
    parser.add_argument("--n", type=int, nargs="+", default=[100_000, 1_000], help="estimation samples per input")
    parser.add_argument("--inputs", type=int, default=5, help="images certified per timing at n > 1,000")
    parser.add_argument("--inputs-small", type=int, default=30, help="images certified per timing at n <= 1,000")
    parser.add_argument("--blocks", type=int, default=18, help="residual blocks per stage (18: ResNet-110)")
    parser.add_argument("--batch-size", type=int, default=1000, help="noisy copies per forward pass (Cohen: 1000)")
    parser.add_argument("--smoothsk-batch-size", type=int, nargs="+",
                        help="smoothsk's certify_batch_size values (default: --batch-size); packing inputs lets "
                             "it exceed one input's n, which the per-input loop cannot")
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--fuse-batch-norm", action="store_true",
                        help="fold each batch normalisation into its convolution (both ways of certifying)")
    parser.add_argument("--cudnn-benchmark", action="store_true",
                        help="torch.backends.cudnn.benchmark = True for both (cuDNN times its algorithms per shape)")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench_gpu: no CUDA device here (torch.cuda.is_available() is False); nothing measured. "
              "Run it on a machine with a GPU, or pass --device cpu for a smoke run.")
        return 0
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{name}, torch {torch.__version__}, ResNet-{6 * args.blocks + 2}, per-input loop batch {args.batch_size}, "
          f"n0 = {N0}, cudnn.benchmark {args.cudnn_benchmark}, batch norm fused {args.fuse_batch_norm}")
    table_header(["n", "images", "precision", "smoothsk batch", "smoothsk s/image", "per-input loop s/image",
                  "speed-up"])
    for n in args.n:
        inputs = args.inputs if n > 1_000 else args.inputs_small
        X = np.random.default_rng(0).random((inputs, 3, 32, 32), dtype=np.float32)
        for precision in args.precisions:
            loop = None
            for batch_size in args.smoothsk_batch_size or [args.batch_size]:
                seconds, module = time_smoothsk(X, n, args.blocks, batch_size, device, precision,
                                                args.fuse_batch_norm)
                if loop is None:
                    loop = time_loop(module, X, n, args.batch_size, device, precision)
                table_row([f"{n:,}", str(inputs), precision, f"{batch_size:,}", f"{seconds / len(X):.4f}",
                           f"{loop / len(X):.4f}", f"{loop / seconds:.2f}x"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
