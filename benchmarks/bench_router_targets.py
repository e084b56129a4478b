"""Which expert serves an image best: on the experts' own training images, and on images they never saw.

The router's selector learns, for each image of the split it is fitted on,
the level whose expert certifies the largest radius there. This script
estimates those radii for the three MNIST experts of ``bench_mnist.py`` (its
trained models, read from ``--out``, or trained there first as
``bench_mnist.py`` would) on the first ``--images`` images of the
protocol's training, validation and certify splits: ``--samples`` noisy
copies per image and expert, the radius ``sigma * PhiInv(p)`` of the
frequency ``p`` of the label (0 where ``p <= 1/2``), capped at what CERTIFY at
n = 100,000 and alpha = 0.001 can certify (``PhiInv(alpha ** (1 / n))``
times sigma). These are estimates for comparing splits, not certificates.

Run ``python benchmarks/bench_router_targets.py [--training consistency --optimizer published]``
(about a minute per split on one core at the defaults).
"""

from pathlib import Path

import numpy as np
import torch
from scipy import stats

from smoothsk.datasets import load_mnist_protocol
from smoothsk.engine import MonteCarloEngine

from _common import markdown_table, quick_parser
from bench_mnist import OPTIMIZERS, PUBLISHED_N, SIGMAS, trained

SPLITS = ("train", "validation", "certify")


def estimated_radii(module, X, y, sigma, samples):
    """Estimated radius of each image at ``sigma``: shape (n_images,), 0 where the label's frequency is <= 1/2."""
    engine = MonteCarloEngine(module.eval(), n_classes=10, batch_size=1000, root_seed=1)
    counts = engine.class_counts(torch.as_tensor(X), sigma, samples, stage=(1,))
    frequency = counts[np.arange(len(y)), y] / samples
    cap = stats.norm.ppf(0.001 ** (1 / PUBLISHED_N))
    return np.where(frequency > 0.5, sigma * np.minimum(stats.norm.ppf(np.minimum(frequency, 1.0)), cap), 0.0)


def main():
    parser = quick_parser(__doc__, "100 images per split, 100 copies")
    parser.add_argument("--training", default="gaussian", help="the experts' training row (default gaussian)")
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS), help="as in bench_mnist.py")
    parser.add_argument("--data", default="../shared/data/mnist", help="folder of the real MNIST files")
    parser.add_argument("--out", default="benchmarks/results/mnist", help="bench_mnist.py's folder of models")
    parser.add_argument("--images", type=int, default=500, help="images per split, the first so many")
    parser.add_argument("--samples", type=int, default=200, help="noisy copies per image and expert")
    args = parser.parse_args()
    images, samples = (100, 100) if args.quick else (args.images, args.samples)
    splits = load_mnist_protocol(args.data)
    settings = {"n": PUBLISHED_N, "epochs": 90, "train": len(splits.X_train), "device": "cpu",
                "certify_batch_size": 1000}
    if args.optimizer and args.optimizer != "ours":
        settings["optimizer"] = args.optimizer
    experts = [trained(args.training, sigma, splits, settings, Path(args.out))[0].module_ for sigma in SIGMAS]
    rows = []
    for split in SPLITS:
        X, y = splits[f"X_{split}"][:images], splits[f"y_{split}"][:images]
        radius = np.stack([estimated_radii(expert, X, y, sigma, samples)
                           for expert, sigma in zip(experts, SIGMAS, strict=True)])
        best = np.where(radius.max(axis=0) > 0, radius.argmax(axis=0), -1)
        rows.append([split, " / ".join(f"{value:.3f}" for value in radius.mean(axis=1)),
                     " / ".join(f"{np.mean(best == level):.0%}" for level in range(len(SIGMAS))),
                     f"{np.mean(best == -1):.0%}"])
    print(f"{args.training} experts, {images} images per split, {samples} copies per image and expert\n")
    markdown_table(["split", "mean radius at sigma " + " / ".join(f"{s:g}" for s in SIGMAS),
                    "best expert " + " / ".join(f"{s:g}" for s in SIGMAS), "none"], rows)


if __name__ == "__main__":
    main()
