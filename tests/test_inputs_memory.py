"""Streamed inputs: host memory of ``certify`` on a Dataset does not grow with the number of inputs."""

from memory_support import run_probe

#: Inputs of the probe's Dataset, each generated when read.
N_INPUTS = 2000
#: Bytes of one 3x224x224 float32 input.
INPUT_BYTES = 3 * 224 * 224 * 4

# Run in a fresh interpreter: the peak resident set size growth during the certify call.
PROBE = """
import json, sys
import numpy as np, torch
from memory_support import PatchConv, peak_rss_growth
from smoothsk import SampleWiseSmoothedClassifier
from smoothsk.sampling import FixedSampler

class Generated:
    '''Input i made when it is read (every pixel i / n_inputs), with a label: no input exists before it is read.'''

    def __init__(self, n_inputs):
        self.n_inputs = n_inputs

    def __len__(self):
        return self.n_inputs

    def __getitem__(self, index):
        return np.full((3, 224, 224), index / self.n_inputs, dtype=np.float32), index % 2

torch.set_num_threads(1)
clf = SampleWiseSmoothedClassifier.from_module(PatchConv(), input_shape=(3, 224, 224), certify_batch_size=16,
                                               sampler=FixedSampler(n=1, n0=1), random_state=0)
with peak_rss_growth() as growth:
    prediction, radius = clf.certify(Generated(int(sys.argv[1])))
print(json.dumps({"peak": growth[0], "certified": len(prediction)}))
"""


def test_certify_memory_of_a_streamed_dataset_does_not_grow_with_its_size():
    """2,000 inputs of 3x224x224 (1.2 GB in float32), generated as they are read, certified with n = n0 = 1.

    The Dataset is read twice (checked, then certified) in chunks of ``smoothsk._inputs.CHUNK_BYTES`` (32 MiB),
    and the engine holds batches of 16 noisy copies. Measured: 175-275 MB of peak growth on one core, in
    15-20 s; as one array the inputs alone would take 1.2 GB.
    """
    probe = run_probe(PROBE, N_INPUTS)
    assert probe["certified"] == N_INPUTS
    # A few hundred MB at most: one chunk of inputs, the batch's noise and the allocator's slack; a third of
    # what the inputs take as one array.
    assert probe["peak"] < N_INPUTS * INPUT_BYTES / 3, probe
