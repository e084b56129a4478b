"""The MNIST router with a wider CNN selector at noise 1.0, fitted on images no expert trained on.

``bench_mnist.py --rows router-gaussian`` routes the three Gaussian LeNets
with the selector's defaults: a LeNet started from the sigma-1.0 expert,
noise 1.0 (0.75 before 2026-11-30), the estimator's SGD, fitted on the experts' own training split.
This script certifies the same experts (``bench_mnist.py``'s models, read
from ``--out``, or trained there first as it would) behind a
``CertifiedSigmaSelector`` whose selector is :class:`SelectorCNN` (three
3x3 convolutions of 32 / 64 / 64 channels, the last two of stride 2, then
dense 128), from random weights, at noise 1.0, trained 40 epochs with Adam
(lr 1e-3, batches of 128) on the protocol's 4,500 validation images, with
targets scored at the certification budget. It certifies ``G`` (stateless)
on the first ``--images`` certify images at ``--n`` and prints the row as
``bench_mnist.py`` does, with each image's level.

The fitted selector's weights are kept in ``--out`` (a safetensors file of
its ``state_dict``, tensors only) and the certification is checkpointed
every 20 images, so a rerun resumes. A model file of the whole router is not
written: the selector's class is this script's, and smoothsk's model files
build modules only from the classes the reader allows.

Run ``python benchmarks/bench_router_cnn_selector.py`` (about 10 minutes of
fit and 6 s per image on one core at the defaults; ``docs/mnist.md`` has
the figures).
"""

from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from smoothsk import SampleWiseSmoothedClassifier
from smoothsk.datasets import load_mnist_protocol
from smoothsk.experts import NoiseLevelExperts
from smoothsk.metrics import average_certified_radius, certified_accuracy_curve
from smoothsk.sampling import FixedSampler
from smoothsk.sigma import CertifiedSigmaSelector
from smoothsk.training import Pretrained

from _common import markdown_table, quick_parser
from bench_mnist import PUBLISHED_N, RADII, SIGMAS, r1_capped, trained

#: The selector's noise, epochs, and Adam's rate and batch size.
SELECTOR_SIGMA, EPOCHS, LR, BATCH_SIZE = 1.0, 40, 1e-3, 128


class SelectorCNN(torch.nn.Module):
    """The selector: (batch, 1, 28, 28) images to (batch, n_classes) logits, one per noise level."""

    def __init__(self, n_classes=3):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(32, 64, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(64, 64, 3, stride=2, padding=1), torch.nn.ReLU(), torch.nn.Flatten())
        self.head = torch.nn.Sequential(torch.nn.Linear(64 * 7 * 7, 128), torch.nn.ReLU(),
                                        torch.nn.Linear(128, n_classes))

    def forward(self, x):
        return self.head(self.features(x))


def router(experts, n, epochs):
    """The unfitted router over ``experts`` (one per sigma of ``SIGMAS``), CERTIFY at ``n``."""
    return SampleWiseSmoothedClassifier(
        NoiseLevelExperts(SIGMAS, experts), training=Pretrained(),
        sigma_search=CertifiedSigmaSelector(selector=SelectorCNN, selector_sigma=SELECTOR_SIGMA,
                                            selector_epochs=epochs, init_from_classifier=False),
        optimizer=torch.optim.Adam, lr=LR, batch_size=BATCH_SIZE, sampler=FixedSampler(n=n, n0=100),
        alpha=0.001, random_state=0)


def main():
    parser = quick_parser(__doc__, "500 validation images, 2 epochs, 10 images at n = 1,000")
    parser.add_argument("--data", default="../shared/data/mnist", help="folder of the real MNIST files")
    parser.add_argument("--out", default="benchmarks/results/mnist", help="bench_mnist.py's folder of models")
    parser.add_argument("--images", type=int, default=500, help="certify images, the first so many")
    parser.add_argument("--n", type=int, default=PUBLISHED_N, help="noisy copies per image (default 100,000)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    fit_images, epochs, images, n = (500, 2, 10, 1000) if args.quick else (None, EPOCHS, args.images, args.n)
    splits, out = load_mnist_protocol(args.data), Path(args.out)
    settings = {"n": PUBLISHED_N, "epochs": 90, "train": len(splits.X_train), "device": "cpu",
                "certify_batch_size": 1000}
    experts = [trained("gaussian", sigma, splits, settings, out)[0].module_ for sigma in SIGMAS]
    clf = router(experts, n, epochs)
    stem = f"router-cnn-selector-n{n}" + ("-quick" if args.quick else "")
    weights = out / f"{stem}-selector.safetensors"
    fitted_before = weights.exists()
    if fitted_before:  # an earlier run's selector, used as it is
        selector = SelectorCNN()
        selector.load_state_dict(load_file(weights))
        clf.set_params(sigma_search__selector=selector, sigma_search__fit_selector=False)
    clf.fit(splits.X_validation[:fit_images], splits.y_validation[:fit_images])
    if not fitted_before:
        save_file({key: value.contiguous() for key, value in clf.sigma_search_.selector_module_.state_dict().items()},
                  weights)

    X, y = splits.X_certify[:images], splits.y_certify[:images]
    prediction, radius, details = clf.certify(X, return_details=True, checkpoint=out / f"{stem}-i{images}.ckpt",
                                              checkpoint_every=20)
    routed = " / ".join(f"{np.sum(np.isclose(details.sigma, sigma))}" for sigma in SIGMAS)
    print(f"{images} images at n = {n:,}; guarantee: {details.guarantee}\n")
    markdown_table(["ACR", *(f"r = {r:g}" for r in RADII), "R1 caps", "samples per image",
                    "images routed to " + " / ".join(f"{s:g}" for s in SIGMAS)],
                   [[f"{average_certified_radius(y, prediction, radius):.3f}",
                     *(f"{v:.3f}" for v in certified_accuracy_curve(y, prediction, radius, RADII)),
                     f"{r1_capped(details, prediction == y):.0%}",
                     f"{np.mean(details.n_samples + details.sigma_samples):,.0f}", routed]])


if __name__ == "__main__":
    main()
