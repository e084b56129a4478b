"""Real MNIST against the published tables: LeNet trained with each objective at sigma 0.25, 0.5 and 1.0.

The shared protocol (``smoothsk.datasets.load_mnist_protocol``): 10,000 training
images (the 5,000-image CSV and the odd test images), the 500 certify images
(every 20th test image), n = 100,000 and alpha = 0.001 as Cohen et al. Each
row trains LeNet (SGD, lr 0.05, momentum 0.9, batch 64, 90 epochs, the rate
divided by 10 every 30 as Jeong and Shin) with one objective at
one sigma and certifies ``g`` at that sigma; beside its ACR stands the
published ACR of the same training on the same 500 images (Jeong and Shin
2020's released logs, trained on all 60,000 images) and the ratio. LeNet is
LeNet-5 (``smoothsk.models.LeNet``); ``--arch caffe-lenet`` trains the
published logs' network instead (``CaffeLeNet``: conv 20, conv 50, dense 500),
named in the files.

Rows, with the settings of Jeong and Shin's released MNIST logs: Gaussian
(Cohen et al.), Consistency (m = 2, eta 0.5, lambda 10 at sigma 0.25 and 5 at
0.5 and 1.0), MACER (m = 16, beta 16, gamma 8, lambda 16 at 0.25 and 0.5 and
6 at 1.0, the radius term deferred to the first learning-rate drop), SmoothAdv
(PGD, 10 steps, epsilon 1.0 warmed up over the first 10 of 90 epochs, m = 4)
and SmoothAdv + Consistency (that SmoothAdv, lambda 1). Per-input sigma over one training's three
models (``router-<training>``): the three LeNets as experts of a
``NoiseLevelExperts``, used as trained (``Pretrained``), routed by a
``CertifiedSigmaSelector`` with its defaults (n = 10,000 selector samples) fitted on the training split
(where R1 caps a radius, the experts of the levels the selector may switch
to are certified too): certificates of ``G``, stateless, its samples per
image counting the selector's, and the share of correct images whose radius
the selector's R1 caps. ``router-plain-<training>``: the same fitted router
with ``certify_reachable_levels=False`` (the radius ``min(R1, R2)``). ``pfat-selector``: one
LeNet trained with PFAT's schedule over 0.25-1.0
and the selector with its defaults (the single-model path); ``pfat-fixed-<sigma>``: the same
model certified at that one sigma (``g`` at that sigma), the baseline the selector must beat.
``oracle-<training>``: each image's best of the three by their own
certificates, a ceiling and not a certificate. The papers' sample-wise
methods on LeNet, each row labelled with the classifier its certificates are
about: ``pfat-online`` (PFAT's schedule over 0.25-1.0, its grid search at
test time, ``OnlineBallAllocator``: a stateful region classifier),
``insta-rs`` (Insta-RS Train and multi-start FGSS from sigma 0.25, levels up
to 1.0: the own-sigma ``g``), ``ddrs-memory`` (DDRS's data-dependent training
and gradient search from 0.25, ``MemoryAllocator``), and ``iss-<sigma>`` /
``sequential-<sigma>`` (the Gaussian model at ``sigma`` certified with
``InputSpecificSampler`` / ``SequentialSampler`` at ``n_max = n``). Last, the certify time per
image against Cohen et al.'s per-input loop (``core.py``) on the Gaussian
sigma-0.25 LeNet (``--loop-images``).

Long: each row's model and certification are checkpointed under ``--out``
(default ``benchmarks/results/mnist``): rerun the same command after an
interruption and finished rows are read back, a row being certified resumes
after its last finished chunk. ``--quick`` is n = 10,000 on the first 100
certify images with 10 epochs; ``--rows`` picks rows (``gaussian-0.25,...``,
``router-gaussian``, ``oracle-gaussian``). Models are stored once per training
and epochs (``gaussian-sigma0.5-e90.safetensors``): ``--n`` and ``--images``
certify the same models.

Like the ``smoothsk`` command, the script keeps freed memory in its process
(:func:`smoothsk.allocator.keep_freed_memory`): at glibc's defaults the
kernel's page faults took 46% of a MACER training run's CPU time, and a MACER
epoch takes 1.6x as long (SmoothAdv's 1.4x).

Run ``python benchmarks/bench_mnist.py [--quick] [--rows ...] [--data ../shared/data/mnist]``.
"""

import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch
from skorch.callbacks import LRScheduler

from smoothsk import ABSTAIN, SampleWiseSmoothedClassifier
from smoothsk._presets import MODULES
from smoothsk.allocator import keep_freed_memory
from smoothsk.datasets import load_mnist_protocol
from smoothsk.experts import NoiseLevelExperts
from smoothsk.metrics import average_certified_radius, certified_accuracy_curve
from smoothsk.regions import MemoryAllocator, OnlineBallAllocator
from smoothsk.sampling import FixedSampler, InputSpecificSampler, SequentialSampler
from smoothsk.sigma import CertifiedSigmaSelector, FixedSigma, GradientSigmaSearch, GridSigmaSearch, MultiStartFGSS
from smoothsk.sigma._selector import SELECTOR_NOISE_PER_LEVEL
from smoothsk.statistics import certified_radius
from smoothsk.training import (
    Consistency,
    DataDependentTraining,
    FixedSigmaTraining,
    GaussianNoise,
    InstaRSTrain,
    Macer,
    Pretrained,
    PretrainFinetune,
    SmoothAdv,
)

from _common import quick_parser, timed
from bench_certify import in_layout, per_input_loop

SIGMAS = (0.25, 0.5, 1.0)
#: The noise a selector with the defaults resolves to over these levels (and PFAT's 0.25-1.0): it names the files
#: of every row fitted with it, so that none fitted under another default is read back as the default's.
DEFAULT_SELECTOR_SIGMA = SELECTOR_NOISE_PER_LEVEL * max(SIGMAS)
#: The default selector's rule (``level_threshold``): it names every certificate of such a selector, for the same
#: reason (it needs no refit, so it names results, not model files).
DEFAULT_LEVEL_THRESHOLD = CertifiedSigmaSelector().level_threshold
#: The networks ``--arch`` names, by ``smoothsk fit --module``'s names: LeNet (the default) and the published
#: tables' CaffeLeNet (Jeong and Shin's released code).
ARCHITECTURES = {name: MODULES[name] for name in ("lenet", "caffe-lenet")}
#: Radii of the published certified-accuracy columns (sigma 1.0).
RADII = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 2.5])
#: Samples per certificate of the published figures.
PUBLISHED_N = 100_000
#: Published ACR on the protocol's 500 images (Jeong and Shin 2020's logs, CaffeLeNet, 60,000 training images).
PUBLISHED_ACR = {
    "gaussian": {0.25: 0.898, 0.5: 1.537, 1.0: 1.606},
    "consistency": {0.25: 0.918, 0.5: 1.633, 1.0: 1.731},
    "macer": {0.25: 0.908, 0.5: 1.571, 1.0: 1.592},
    "smoothadv": {0.25: 0.921, 0.5: 1.670, 1.0: 1.771},
    "smoothadv+consistency": {0.25: 0.921, 0.5: 1.679, 1.0: 1.809},
}
#: Published certified accuracy at RADII, sigma 1.0, same images.
PUBLISHED_CURVE = {
    "gaussian": (0.954, 0.900, 0.794, 0.586, 0.316, 0.110),
    "consistency": (0.936, 0.885, 0.786, 0.628, 0.410, 0.210),
    "macer": (0.901, 0.823, 0.714, 0.553, 0.391, 0.193),
    "smoothadv": (0.949, 0.896, 0.800, 0.636, 0.430, 0.229),
    "smoothadv+consistency": (0.930, 0.876, 0.787, 0.634, 0.451, 0.297),
}


#: The router's max_epochs: its selector's training (the experts are used as trained).
SELECTOR_EPOCHS = 15
#: Sample-wise rows, which have no sigma of their own.
SAMPLE_WISE_ROWS = ("pfat-online", "insta-rs", "ddrs-memory")
#: Sampler rows (``<name>-<sigma>``): the Gaussian model at that sigma, certified with this sampler.
SAMPLERS = {"iss": InputSpecificSampler, "sequential": SequentialSampler}


def objective(name, sigma, epochs):
    """The training objective of row ``name`` at ``sigma`` for ``epochs`` (the settings of the published logs).

    Jeong and Shin's released MNIST logs: MACER ``macer_deferred30/num_16/
    lbd_16.0`` (``lbd_6.0`` at sigma 1.0), SmoothAdv ``pgd_255.0_10_10/num_4``
    (epsilon 1.0, 10 steps, warm-up over 10 epochs), SmoothAdv + Consistency
    ``salman_255.0_10_10/num_4/lbd_1.0``; the deferral and the warm-up scale
    with ``epochs`` (30 and 10 of 90).
    """
    smoothadv = SmoothAdv(epsilon=1.0, steps=10, num_noise=4, warmup_epochs=max(1, epochs // 9))
    return {"gaussian": GaussianNoise(),
            "consistency": Consistency(lbd=10.0 if sigma == 0.25 else 5.0, eta=0.5),
            "macer": Macer(num_noise=16, beta=16.0, gamma=8.0, lbd=6.0 if sigma == 1.0 else 16.0,
                           deferred_epochs=epochs // 3),
            "smoothadv": smoothadv,
            "smoothadv+consistency": Consistency(lbd=1.0, eta=0.5, base=smoothadv)}[name]


#: The optimisers a row can train with (``--optimizer``): ours (the default), and Jeong and Shin's released
#: MNIST settings (SGD with Nesterov momentum, weight decay 1e-4, batches of 256, lr 0.01).
OPTIMIZERS = {"ours": {"lr": 0.05, "optimizer__momentum": 0.9, "batch_size": 64},
              "published": {"lr": 0.01, "optimizer__momentum": 0.9, "optimizer__nesterov": True,
                            "optimizer__weight_decay": 1e-4, "batch_size": 256}}


def estimator_settings(settings):
    """What every row's estimator shares: the optimiser, CERTIFY's sampler at ``n``, alpha, device, batches, seed."""
    return {**OPTIMIZERS[settings.get("optimizer", "ours")], "random_state": 0, "alpha": 0.001,
            **certify_settings(settings)}


def certify_settings(settings):
    """CERTIFY at this run's ``n`` on this run's device and certify batch."""
    return {"sampler": FixedSampler(n=settings["n"], n0=100), "device": settings["device"],
            "certify_batch_size": settings["certify_batch_size"]}


def read_back(model_path, settings):
    """The model saved at ``model_path``, certifying with CERTIFY at this run's ``n`` on this run's device.

    Models are stored once per training and epochs: the file keeps the
    sampler, device and certify batch of the run that trained it, which
    another run's ``--n``, ``--device`` and ``--certify-batch-size`` replace.
    """
    return SampleWiseSmoothedClassifier.load(model_path).set_params(**certify_settings(settings))


def fitted(model_path, estimator, splits, settings, split="train"):
    """``estimator`` fitted on ``split`` and saved at ``model_path``, or the model read back from there.

    The training split's first ``settings["train"]`` images, or the whole
    ``"validation"`` split.

    Either way the model is certified as read back (:func:`read_back`).

    Returns
    -------
    clf : SampleWiseSmoothedClassifier
    seconds : float or None
        The fit's seconds; None when read back.
    """
    if model_path.exists():
        return read_back(model_path, settings), None
    start = time.perf_counter()
    rows = slice(0, settings["train"]) if split == "train" else slice(None)
    estimator.fit(splits[f"X_{split}"][rows], splits[f"y_{split}"][rows])
    seconds = time.perf_counter() - start
    estimator.save(model_path)
    # Certify the model as a later run reads it back (no callbacks, this run's sampler): a checkpoint's
    # fingerprint covers the estimator's parameters, so an interrupted row then resumes in a new process.
    return read_back(model_path, settings), seconds


def classifier(name, sigma, settings):
    """An unfitted LeNet estimator for row ``name`` at ``sigma``: the published schedule, lr / 10 every third.

    Jeong and Shin train 90 epochs and divide the learning rate by 10 every
    30; measured here (Gaussian, sigma 1.0, n = 10,000): 30 epochs at a
    constant rate certify ACR 1.176, 90 epochs with the decay 1.361.
    """
    decay = LRScheduler(policy="StepLR", step_size=max(1, settings["epochs"] // 3), gamma=0.1)
    return SampleWiseSmoothedClassifier(
        network(settings), training=FixedSigmaTraining(sigma, objective(name, sigma, settings["epochs"])),
        max_epochs=settings["epochs"], callbacks=[("lr_decay", decay)], **estimator_settings(settings))


def stem(name, sigma, splits, settings, model=False):
    """The file stem of row ``name`` at ``sigma`` (None: a row over every sigma) under these settings.

    With ``model``, the stem of its trained model, which the certification
    settings (``n``, ``images``) do not change.
    """
    text = f"{name}-sigma{sigma:g}" if sigma is not None else name
    text += f"-e{settings['epochs']}" if model else f"-n{settings['n']}-e{settings['epochs']}-i{settings['images']}"
    if name.startswith("router"):
        text += selector_tag(settings)
    elif name == "pfat-selector":
        text += pfat_selector_tag(model)
    if "optimizer" in settings:
        text += f"-{settings['optimizer']}-optimizer"
    text += arch_tag(settings)
    return text + (f"-t{settings['train']}" if settings["train"] != len(splits.X_train) else "")


def network(settings):
    """The module class every row trains: ``--arch``'s (LeNet by default)."""
    return ARCHITECTURES[settings.get("arch", "lenet")]


def arch_tag(settings):
    """The file-name suffix for ``--arch`` ("" for LeNet)."""
    return f"-{settings['arch']}" if "arch" in settings else ""


def trained(name, sigma, splits, settings, out):
    """Row ``name``'s classifier at ``sigma``, trained and saved, or read back; and its training seconds (None)."""
    model_path = out / f"{stem(name, sigma, splits, settings, model=True)}.safetensors"
    return fitted(model_path, classifier(name, sigma, settings), splits, settings)


def router(name, splits, settings, out):
    """The sound router over row ``name``'s experts at every sigma: their LeNets in a NoiseLevelExperts.

    No expert is trained again (``Pretrained``): the selector is fitted on
    the training split with its defaults and certifies its level per input
    (``G``, stateless), the expert of that level certifies the class. The
    fitted router is saved (experts and selector in one model file, named by
    what its fit depends on) and read back by later runs, so certificate
    variants share one fit: ``--selector`` parameters that need no refit
    (e.g. ``reachable_n``, the selector's ``n``) are set on the router read
    back. The fit's seconds are None when read back.
    """
    fit_params, certify_params = selector_params(settings)
    # The selector's targets are scored at the certification budget (--router-fit-n): one fit per such n.
    fit_n = settings.get("router_fit_n", settings["n"])
    model_path = out / (f"router-{stem(name, None, splits, settings, model=True)}-n{fit_n}"
                        f"{params_tag(fit_params)}{split_tag(settings)}.safetensors")
    if model_path.exists():
        clf, seconds = read_back(model_path, settings), None
    else:
        experts = [trained(name, sigma, splits, settings, out)[0].module_ for sigma in SIGMAS]
        clf, seconds = fitted(model_path, SampleWiseSmoothedClassifier(
            NoiseLevelExperts(SIGMAS, experts), training=Pretrained(), sigma_search=CertifiedSigmaSelector(
                **fit_params), max_epochs=min(settings["epochs"], SELECTOR_EPOCHS),
            **estimator_settings({**settings, "n": fit_n})), splits, settings, settings.get("router_split", "train"))
    return clf.set_params(**{f"sigma_search__{key}": value for key, value in certify_params.items()}), seconds


def selector_params(settings):
    """The router's ``CertifiedSigmaSelector`` parameters from ``--selector`` (``name=number,...``; none: defaults).

    Returns
    -------
    fit_params : dict
        The parameters a fit depends on: the given ones, and the selector's
        noise always (given, or the default's value over these levels), so
        that a file fitted under another default is never read back as the
        default's.
    certify_params : dict
        Every parameter that needs no refit, given or default, so that a
        router read back certifies with this run's values.
    """
    given = given_selector_params(settings)
    refit_free = CertifiedSigmaSelector._refit_free_parameters
    defaults = CertifiedSigmaSelector().get_params()
    return ({"selector_sigma": DEFAULT_SELECTOR_SIGMA,
             **{key: value for key, value in given.items() if key not in refit_free}},
            {key: given.get(key, defaults[key]) for key in refit_free})


def given_selector_params(settings):
    """``--selector``'s parameters as a dict (``name=number,...``; empty for none)."""
    pairs = (item.split("=") for item in settings.get("selector", "").split(",") if item)
    return {key: float(value) if "." in value else int(value) for key, value in pairs}


def params_tag(params):
    """A file-name suffix for parameters (``-n100000-reachable_n20000``; "" for none)."""
    return "".join(f"-{key}{value}" for key, value in params.items())


def selector_tag(settings):
    """The router rows' file-name suffix: the selector's fit parameters (its noise always), the other
    ``--selector`` parameters, its ``level_threshold`` always (given or default), and ``--router-fit-n``."""
    fit_params, certify_params = selector_params(settings)
    named = {**fit_params, **given_selector_params(settings)}
    named.pop("level_threshold", None)
    text = params_tag({**named, "level_threshold": certify_params["level_threshold"]})
    text += f"-fit{settings['router_fit_n']}" if "router_fit_n" in settings else ""
    return text + split_tag(settings)


def split_tag(settings):
    """The router's file-name suffix for ``--router-split`` ("" for the training split)."""
    return f"-on-{settings['router_split']}" if "router_split" in settings else ""


def pfat_selector(splits, settings, out):
    """One LeNet trained with PFAT's schedule over the levels 0.25, 0.5, 0.75, 1.0, routed by the selector.

    ``PretrainFinetune(0.25, 1.0)`` with Gaussian noise (two copies, the
    selector preset's training) for ``epochs`` (half pretraining, half
    finetuning at a tenth of the rate), then a ``CertifiedSigmaSelector``
    with its defaults over the schedule's grid: today's single-model path,
    certificates of ``G``.
    """
    half = settings["epochs"] // 2
    training = PretrainFinetune(0.25, 1.0, pretrain_epochs=half, finetune_epochs=settings["epochs"] - half,
                                finetune_lr=0.005, objective=GaussianNoise(2),
                                assignment=GridSigmaSearch(0.25, 1.0, 0.25, n=100))
    return fitted(out / f"pfat-selector-e{settings['epochs']}{pfat_selector_tag(model=True)}{arch_tag(settings)}"
                  ".safetensors",
                  SampleWiseSmoothedClassifier(network(settings), training=training,
                                               sigma_search=CertifiedSigmaSelector(), max_epochs=settings["epochs"],
                                               **estimator_settings(settings)), splits, settings)


def pfat_selector_tag(model):
    """The PFAT + selector row's file-name suffix: what its default selector resolves to (its noise; for its
    certificates, also its ``level_threshold``), so that a file made under another default is never read back."""
    return params_tag({"selector_sigma": DEFAULT_SELECTOR_SIGMA,
                       **({} if model else {"level_threshold": DEFAULT_LEVEL_THRESHOLD})})


def sample_wise_params(name, epochs):
    """Estimator parameters of sample-wise row ``name`` over MNIST's sigma range 0.25-1.0 (the papers' schedules)."""
    half = max(1, epochs // 2)
    if name == "pfat-online":
        return {"training": PretrainFinetune(0.25, 1.0, pretrain_epochs=half, finetune_epochs=epochs - half,
                                             finetune_lr=0.005, objective=GaussianNoise(2),
                                             assignment=GridSigmaSearch(0.25, 1.0, 0.25, n=100)),
                "sigma_search": GridSigmaSearch(0.25, 1.0, 0.25, n=200), "allocator": OnlineBallAllocator()}
    if name == "insta-rs":  # levels sqrt(l) * 0.25, l = 1..16: sigma 0.25 to 1.0
        return {"training": InstaRSTrain(sigma0=0.25, max_level=16, update_every=max(1, half // 15),
                                         stage1_epochs=half, stage2_epochs=epochs - half, stage2_lr=0.005),
                "sigma_search": MultiStartFGSS(0.25, 16, n=200)}
    return {"training": DataDependentTraining(0.25, steps=1, lr=0.01, warmup_epochs=epochs // 4),  # ddrs-memory
            "sigma_search": GradientSigmaSearch(0.25, steps=100, lr=0.002, sigma_max=2.0),
            "allocator": MemoryAllocator()}


def sample_wise(name, splits, settings, out):
    """Sample-wise row ``name``'s LeNet, trained and saved, or read back; and its training seconds (None)."""
    return fitted(out / f"{name}-e{settings['epochs']}{arch_tag(settings)}.safetensors", SampleWiseSmoothedClassifier(
        network(settings), **sample_wise_params(name, settings["epochs"]), max_epochs=settings["epochs"],
        **estimator_settings(settings)), splits, settings)


def run_row(name, sigma, splits, settings, out):
    """Train (or read back) and certify (resuming) one row; its results as a dict, also written to ``out``.

    ``name`` ``router-<training>`` (``sigma`` None) is the sound router
    over that training's experts (:func:`router`); its selector's fit is
    its training time, and it reports the share of correctly classified
    images whose radius the selector's own radius R1 caps.
    """
    row_stem = stem(name, sigma, splits, settings)
    result_path = out / f"{row_stem}.json"
    if result_path.exists():
        return json.loads(result_path.read_text())
    if name == "pfat-selector":
        clf, train_seconds = pfat_selector(splits, settings, out)
    elif name == "pfat-fixed":  # the selector's model without the selector: does routing beat its best sigma?
        clf, train_seconds = pfat_selector(splits, settings, out)
        clf.set_params(sigma_search=FixedSigma(sigma))
    elif name.startswith("router-plain-"):
        clf, train_seconds = router(name.removeprefix("router-plain-"), splits, settings, out)
        clf.set_params(sigma_search__certify_reachable_levels=False)
    elif name in SAMPLE_WISE_ROWS:
        clf, train_seconds = sample_wise(name, splits, settings, out)
    elif name in SAMPLERS:
        clf, train_seconds = trained("gaussian", sigma, splits, settings, out)
        clf.set_params(sampler=SAMPLERS[name](n_max=settings["n"]))
    elif sigma is None:
        clf, train_seconds = router(name.removeprefix("router-"), splits, settings, out)
    else:
        clf, train_seconds = trained(name, sigma, splits, settings, out)
    X, y = splits.X_certify[:settings["images"]], splits.y_certify[:settings["images"]]
    start = time.perf_counter()
    prediction, radius, details = clf.certify(X, return_details=True, checkpoint=out / f"{row_stem}.ckpt",
                                              checkpoint_every=20)
    correct = prediction == y
    result = {"row": name, "sigma": sigma, "acr": average_certified_radius(y, prediction, radius),
              "curve": certified_accuracy_curve(y, prediction, radius, RADII).tolist(),
              "train_seconds": train_seconds, "certify_seconds_per_image": (time.perf_counter() - start) / len(X),
              "samples_per_image": float(np.mean(details.n_samples + details.sigma_samples)),
              "guarantee": details.guarantee,
              "r1_capped": r1_capped(details, correct),
              "sigma_per_image": details.sigma.tolist(),
              "prediction": prediction.tolist(), "radius": radius.tolist()}
    result_path.write_text(json.dumps(result))
    return result


def r1_capped(details, correct):
    """The share of the correctly classified images whose radius the selector's own radius R1 caps.

    Parameters
    ----------
    details : smoothsk.certificates.Certificates
        ``certify``'s details: each image's ``sigma``, ``p_lower`` and ``radius_cap``.
    correct : ndarray of bool, shape (n_images,)
        Whether each image's prediction is its label.

    Returns
    -------
    float
        0.0 where no image is correct.
    """
    own = certified_radius(details.sigma, details.p_lower)
    return float(np.mean((details.radius_cap < own)[correct])) if correct.any() else 0.0


def oracle(results, y):
    """ACR and curve of each image's best expert among ``results`` (rows of one training): NOT a certificate.

    The oracle picks, per image, the expert whose own certificate is the
    largest correct radius: it chooses with the very samples that certify,
    so it certifies nothing; it is the ceiling a router approaches.
    """
    correct = np.array([np.array(r["prediction"]) == y for r in results])
    radius = np.max(np.where(correct, [r["radius"] for r in results], 0.0), axis=0)
    prediction = np.where(correct.any(axis=0), y, ABSTAIN)  # no expert right: the oracle has nothing either
    return (average_certified_radius(y, prediction, radius),
            certified_accuracy_curve(y, prediction, radius, RADII).tolist())


def loop_comparison(splits, settings, out, n_images, repeats=3):
    """Certify time per image against Cohen et al.'s per-input loop (``core.py``) on the same LeNet.

    The Gaussian sigma-0.25 model certifies the first ``n_images`` certify
    images at ``settings["n"]`` with ``certify`` and with
    :func:`bench_certify.per_input_loop` (each input alone, batches of at
    most 1,000 copies, ``torch.randn_like`` noise), interleaved ``repeats``
    times; CPU time of this process, so that other processes do not move the
    ratio. The loop runs the module in the contiguous layout, as their code
    does.

    Returns
    -------
    certify_seconds, loop_seconds : float
        Best CPU seconds per image of each.
    """
    clf, _ = trained("gaussian", 0.25, splits, settings, out)
    X = splits.X_certify[:n_images]
    # A contiguous copy, as Cohen et al.'s code runs: certify converts module_ to channels_last in place.
    module = in_layout(clf.module_, X, torch.contiguous_format)[0].eval()
    best = {"certify": np.inf, "loop": np.inf}
    for _ in range(repeats):
        best["certify"] = min(best["certify"], timed(clf.certify, X, clock=time.process_time)[0])
        best["loop"] = min(best["loop"], timed(per_input_loop, module, X, settings["n"], clf.certify_batch_size,
                                               len(clf.classes_), clock=time.process_time)[0])
    return best["certify"] / n_images, best["loop"] / n_images


def table(rows, splits, settings, out):
    """The results table's markdown lines (header first) and each certificate row's curve data.

    Returns
    -------
    lines : list of str
    curves : dict of str -> (y_true, prediction, radius)
        For :func:`smoothsk.plotting.plot_certified_accuracy` (oracles left out: not certificates).
    """
    header = ["row", "sigma", "ACR", "published ACR", "ratio", *(f"r={r:g}" for r in RADII), "train (s)",
              "certify (s/image)", "samples/image", "R1 caps", "guarantee"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    y = splits.y_certify[:settings["images"]]
    curves = {}
    for row in rows:
        name, sigma = (row, None) if row.startswith(("router-", "oracle-")) or row in (
            "pfat-selector", *SAMPLE_WISE_ROWS) else row.rsplit("-", 1)
        sigma = None if sigma is None else float(sigma)
        if name.startswith("oracle-"):
            acr, curve = oracle([run_row(name.removeprefix("oracle-"), s, splits, settings, out) for s in SIGMAS], y)
            cells = [name, "each image's best", f"{acr:.3f}", "-", "-", *(f"{value:.3f}" for value in curve),
                     "-", "-", "-", "-", "oracle: chooses with the certifying samples, NOT a certificate"]
        else:
            result = run_row(name, sigma, splits, settings, out)
            curves[row] = (y, np.array(result["prediction"]), np.array(result["radius"]))
            # The published figures are at n = 100,000: a smaller n caps the radii, so no ratio is shown.
            published = PUBLISHED_ACR.get(name, {}).get(sigma) if settings["n"] == PUBLISHED_N else None
            cells = [name, "per input" if sigma is None else f"{sigma:g}", f"{result['acr']:.3f}",
                     "-" if published is None else f"{published:.3f}",
                     "-" if published is None else f"{result['acr'] / published:.3f}",
                     *(f"{value:.3f}" for value in result["curve"]),
                     "read back" if result["train_seconds"] is None else f"{result['train_seconds']:.0f}",
                     f"{result['certify_seconds_per_image']:.2f}", f"{result.get('samples_per_image', 0):.0f}",
                     f"{result['r1_capped']:.3f}" if name.startswith(("router-", "pfat-selector")) else "-",
                     result.get("guarantee", "")]
        lines.append("| " + " | ".join(cells) + " |")
        print(lines[-1] if len(lines) > 3 else "\n".join(lines), flush=True)
    return lines, curves


def main():
    parser = quick_parser(__doc__, "n = 10,000 on the first 100 certify images, 10 epochs")
    parser.add_argument("--rows", default=",".join(f"{name}-{sigma:g}" for name in PUBLISHED_ACR for sigma in SIGMAS),
                        help="comma-separated rows, each <training>-<sigma>, router-<training> (the sound router "
                             "over that training's experts at 0.25, 0.5 and 1.0), router-plain-<training>, "
                             "pfat-selector (one PFAT model and the selector), pfat-fixed-<sigma> (that PFAT "
                             "model at one sigma), oracle-<training> (each image's best expert: a ceiling, not a "
                             "certificate), pfat-online, insta-rs, ddrs-memory, "
                             "iss-<sigma> or sequential-<sigma>")
    parser.add_argument("--data", default="../shared/data/mnist", help="folder of the real MNIST files")
    parser.add_argument("--out", default="benchmarks/results/mnist", help="folder of the models and checkpoints")
    parser.add_argument("--report", help="folder to write the results page into (results.md and "
                                         "certified_accuracy.png), e.g. docs/results/mnist")
    parser.add_argument("--device", default="cpu", help="torch device to train and certify on (default cpu)")
    parser.add_argument("--certify-batch-size", type=int, default=1000,
                        help="noisy copies per forward pass (default 1000, Cohen et al.'s)")
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS),
                        help="train with this optimiser: ours (lr 0.05, batches of 64; the default) or published "
                             "(Jeong and Shin's: lr 0.01, Nesterov, weight decay 1e-4, batches of 256), named in "
                             "the files")
    parser.add_argument("--arch", choices=sorted(ARCHITECTURES), default="lenet",
                        help="the network every row trains: lenet (LeNet-5, the default) or caffe-lenet (the "
                             "published tables' network, conv 20 / conv 50 / dense 500), named in the files")
    parser.add_argument("--selector", help="the routers' CertifiedSigmaSelector parameters other than the "
                                           "defaults, e.g. n=100000,selector_sigma=1.0 (named in their files)")
    parser.add_argument("--router-fit-n", type=int,
                        help="the budget at which the routers' selector targets are scored (default: --n); e.g. "
                             "10000 with --n 100000 certifies the router fitted for n = 10,000 at n = 100,000")
    parser.add_argument("--router-split", choices=["train", "validation"], default="train",
                        help="the split the routers' selector is fitted on (default train, the experts' own; "
                             "validation: the 4,500 images no expert trained on, named in the files)")
    parser.add_argument("--loop-images", type=int, default=20,
                        help="images timed against Cohen et al.'s per-input loop (0: skip; default 20)")
    for option, meaning in (("n", "noisy samples per certificate"), ("images", "certify images, the first so many"),
                            ("epochs", "training epochs"),
                            ("train", "training images, the first so many: what the training set's size costs")):
        parser.add_argument(f"--{option}", type=int, help=f"override the mode's {option} ({meaning})")
    args = parser.parse_args()
    keep_freed_memory()  # every row trains and certifies in this process
    splits = load_mnist_protocol(args.data)
    settings = ({"n": 10_000, "images": 100, "epochs": 10} if args.quick else
                {"n": 100_000, "images": 500, "epochs": 90})
    settings["train"] = len(splits.X_train)
    settings.update(device=args.device, certify_batch_size=args.certify_batch_size)
    if args.selector:
        settings["selector"] = args.selector
    if args.router_fit_n:
        settings["router_fit_n"] = args.router_fit_n
    if args.router_split != "train":
        settings["router_split"] = args.router_split
    if args.optimizer and args.optimizer != "ours":
        settings["optimizer"] = args.optimizer
    if args.arch != "lenet":
        settings["arch"] = args.arch
    settings.update({option: getattr(args, option) for option in settings if getattr(args, option) is not None})
    check_training_size(parser, splits, settings["train"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines, curves = table(args.rows.split(","), splits, settings, out)
    notes = []
    if args.loop_images:
        certify_seconds, loop_seconds = loop_comparison(splits, settings, out, args.loop_images)
        notes.append(f"Certify time per image, Gaussian sigma 0.25, n = {settings['n']:,}, {args.loop_images} images "
                     f"(best of 3, CPU time): certify {certify_seconds:.2f} s, Cohen et al.'s per-input loop "
                     f"{loop_seconds:.2f} s: {loop_seconds / certify_seconds:.2f}x (target >= 1.0x).")
    notes.append("Published certified accuracy at sigma 1.0 (r = " + " / ".join(f"{r:g}" for r in RADII) + "): "
                 + "; ".join(f"{name} " + " / ".join(f"{value:.3f}" for value in curve)
                             for name, curve in PUBLISHED_CURVE.items()) + ".")
    print("\n" + "\n\n".join(notes))
    if args.report:
        write_report(Path(args.report), lines, notes, curves, settings)


def check_training_size(parser, splits, size):
    """Exit with a one-line error unless ``--train``'s first ``size`` training images hold every class.

    The protocol's split begins with the 5,000 CSV images in class order, so
    fewer than 5,000 would train on some digits only.
    """
    if not 0 < size <= len(splits.y_train):
        parser.error(f"--train must be between 1 and {len(splits.y_train):,} (the training split's size); got {size}.")
    missing = sorted(set(splits.y_train.tolist()) - set(splits.y_train[:size].tolist()))
    if missing:
        parser.error(f"--train {size} takes the training split's first {size:,} images, which miss digits {missing} "
                     f"(the split begins with the 5,000 CSV images in class order); use 5,000 or more.")


def write_report(folder, lines, notes, curves, settings):
    """Write ``folder/results.md`` (the command that made it, its settings, table and notes) and its curves."""
    import matplotlib
    matplotlib.use("Agg")
    from smoothsk.plotting import plot_certified_accuracy

    folder.mkdir(parents=True, exist_ok=True)
    ax = plot_certified_accuracy(curves, radii=np.linspace(0.0, 4.0, 161))
    ax.set_title(f"Real MNIST, the protocol's {settings['images']} certify images, n = {settings['n']:,}")
    ax.figure.savefig(folder / "certified_accuracy.png", dpi=120, bbox_inches="tight")
    settings_line = ", ".join(f"{key} {value:,}" if isinstance(value, int) else f"{key} {value}"
                              for key, value in settings.items())
    (folder / "results.md").write_text(
        f"Generated by `{shlex.join(['python', 'benchmarks/bench_mnist.py', *sys.argv[1:]])}` ({settings_line}).\n\n"
        + "\n".join(lines) + "\n\n" + "\n\n".join(notes) + "\n\n![certified accuracy](certified_accuracy.png)\n")


if __name__ == "__main__":
    main()
