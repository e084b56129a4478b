"""MonteCarloEngine: host memory of certification is bounded by the batch, whatever the sample size."""

import json
import os
import subprocess
import sys
from pathlib import Path

#: Noisy copies per forward pass in the probe.
BATCH = 100
#: Bytes of one noisy copy of a 3x224x224 float32 input.
COPY_BYTES = 3 * 224 * 224 * 4

# Run in a fresh interpreter: the peak resident set size during each certify call, sampled by a
# thread (tracemalloc does not see torch's allocations), minus the size before the call.
PROBE = """
import json, sys, threading, time
import numpy as np, psutil, torch
from smoothsk import SampleWiseSmoothedClassifier
from smoothsk.sampling import FixedSampler
from smoothsk.sigma import FixedSigma
from smoothsk.training import FixedSigmaTraining

class PatchConv(torch.nn.Module):
    def __init__(self, n_classes=2):
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Conv2d(3, 4, 16, stride=16), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(), torch.nn.Linear(4, n_classes))

    def forward(self, x):
        return self.layers(x)

torch.set_num_threads(1)
X = np.random.default_rng(0).random((2, 3, 224, 224), dtype=np.float32)
clf = SampleWiseSmoothedClassifier(PatchConv, training=FixedSigmaTraining(0.25), sigma_search=FixedSigma(0.25),
                                   max_epochs=0, certify_batch_size=int(sys.argv[1]), random_state=0).fit(X, [0, 1])
process, peaks = psutil.Process(), {}
for n in map(int, sys.argv[2:]):
    clf.set_params(sampler=FixedSampler(n=n, n0=10))
    before = process.memory_info().rss
    peak, done = [before], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], process.memory_info().rss)
            time.sleep(0.001)

    sampler = threading.Thread(target=sample)
    sampler.start()
    clf.certify(X[:1])
    done.set()
    sampler.join()
    peaks[n] = peak[0] - before
print(json.dumps(peaks))
"""


def peak_memory(batch, sample_sizes):
    """Peak host memory added by certifying one 3x224x224 input at each sample size, in bytes."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-c", PROBE, str(batch), *map(str, sample_sizes)], cwd=root, env=env,
                            capture_output=True, text=True, timeout=300, check=True)
    return {int(n): peak for n, peak in json.loads(result.stdout.strip().splitlines()[-1]).items()}


def test_certify_memory_does_not_grow_with_the_sample_size():
    # Both sizes fill whole batches (n >= BATCH), so only the number of batches differs. Materialising
    # the noisy copies would add 750 copies (430 MiB) between them; the batch buffers are 100 copies.
    peaks = peak_memory(BATCH, [250, 1000])
    assert peaks[1000] - peaks[250] < BATCH * COPY_BYTES / 4, peaks
    # A few hundred MB at most: the batch's noise, the random words it is made of and the activations.
    assert max(peaks.values()) < 300 * 2**20, peaks
