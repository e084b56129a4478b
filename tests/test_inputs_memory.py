"""Streamed inputs: host memory of ``certify`` on a Dataset does not grow with the number of inputs."""

import json
import os
import subprocess
import sys
from pathlib import Path

#: Inputs of the probe's Dataset, each generated when read.
N_INPUTS = 2000
#: Bytes of one 3x224x224 float32 input.
INPUT_BYTES = 3 * 224 * 224 * 4

# Run in a fresh interpreter: the peak resident set size during the certify call, sampled by a thread
# (tracemalloc does not see torch's allocations), minus the size before the call.
PROBE = """
import json, sys, threading, time
import numpy as np, psutil, torch
from smoothsk import SampleWiseSmoothedClassifier
from smoothsk.sampling import FixedSampler

class PatchConv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Conv2d(3, 4, 16, stride=16), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(), torch.nn.Linear(4, 2))

    def forward(self, x):
        return self.layers(x)

class Generated:
    '''Input i made when it is read (seeded by i), with a label: no input exists before it is read.'''

    def __init__(self, n_inputs):
        self.n_inputs = n_inputs

    def __len__(self):
        return self.n_inputs

    def __getitem__(self, index):
        return np.random.default_rng(index).random((3, 224, 224), dtype=np.float32), index % 2

torch.set_num_threads(1)
clf = SampleWiseSmoothedClassifier.from_module(PatchConv(), input_shape=(3, 224, 224), certify_batch_size=16,
                                               sampler=FixedSampler(n=1, n0=1), random_state=0)
process = psutil.Process()
before = process.memory_info().rss
peak, done = [before], threading.Event()

def sample():
    while not done.is_set():
        peak[0] = max(peak[0], process.memory_info().rss)
        time.sleep(0.001)

sampler = threading.Thread(target=sample)
sampler.start()
prediction, radius = clf.certify(Generated(int(sys.argv[1])))
done.set()
sampler.join()
print(json.dumps({"peak": peak[0] - before, "certified": len(prediction)}))
"""


def test_certify_memory_of_a_streamed_dataset_does_not_grow_with_its_size():
    """2,000 inputs of 3x224x224 (1.2 GB in float32), generated as they are read, certified with n = n0 = 1.

    The Dataset is read twice (checked, then certified) in chunks of ``smoothsk._inputs.CHUNK_BYTES`` (32 MiB),
    and the engine holds batches of 16 noisy copies. Measured: 175-275 MB of peak growth on one core, in
    15-20 s; as one array the inputs alone would take 1.2 GB.
    """
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-c", PROBE, str(N_INPUTS)], cwd=root, env=env, capture_output=True,
                            text=True, timeout=300, check=True)
    probe = json.loads(result.stdout.strip().splitlines()[-1])
    assert probe["certified"] == N_INPUTS
    # A few hundred MB at most: one chunk of inputs, the batch's noise and the allocator's slack; a third of
    # what the inputs take as one array.
    assert probe["peak"] < N_INPUTS * INPUT_BYTES / 3, probe
