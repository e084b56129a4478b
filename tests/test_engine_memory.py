"""MonteCarloEngine: host memory of certification is bounded by the batch, whatever the sample size."""

from memory_support import run_probe

#: Noisy copies per forward pass in the probe.
BATCH = 100
#: Bytes of one noisy copy of a 3x224x224 float32 input.
COPY_BYTES = 3 * 224 * 224 * 4

# Run in a fresh interpreter: the peak resident set size growth during each certify call.
PROBE = """
import json, sys
import numpy as np, torch
from memory_support import PatchConv, peak_rss_growth
from smoothsk import SampleWiseSmoothedClassifier
from smoothsk.sampling import FixedSampler
from smoothsk.sigma import FixedSigma
from smoothsk.training import FixedSigmaTraining

torch.set_num_threads(1)
X = np.random.default_rng(0).random((2, 3, 224, 224), dtype=np.float32)
clf = SampleWiseSmoothedClassifier(PatchConv, training=FixedSigmaTraining(0.25), sigma_search=FixedSigma(0.25),
                                   max_epochs=0, certify_batch_size=int(sys.argv[1]), random_state=0).fit(X, [0, 1])
peaks = {}
for n in map(int, sys.argv[2:]):
    clf.set_params(sampler=FixedSampler(n=n, n0=10))
    with peak_rss_growth() as growth:
        clf.certify(X[:1])
    peaks[n] = growth[0]
print(json.dumps(peaks))
"""


def peak_memory(batch, sample_sizes):
    """Peak host memory added by certifying one 3x224x224 input at each sample size, in bytes."""
    return {int(n): peak for n, peak in run_probe(PROBE, batch, *sample_sizes).items()}


def test_certify_memory_does_not_grow_with_the_sample_size():
    # Both sizes fill whole batches (n >= BATCH), so only the number of batches differs. Materialising
    # the noisy copies would add 750 copies (430 MiB) between them; the batch buffers are 100 copies.
    peaks = peak_memory(BATCH, [250, 1000])
    assert peaks[1000] - peaks[250] < BATCH * COPY_BYTES / 4, peaks
    # A few hundred MB at most: the batch's noise, the random words it is made of and the activations.
    assert max(peaks.values()) < 300 * 2**20, peaks
