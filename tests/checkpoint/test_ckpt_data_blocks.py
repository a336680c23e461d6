"""A resume that needs more samples of a dataset read several times (a longer --train-iters, a larger
--global-batch-size) reads on exactly where the job before it stopped (data/train_blocks.py)."""
import json
import os

from ckpt_harness import flags, train
from megatron_zaya.data.indexed import IndexedDataset, write_dataset
from megatron_zaya.data.train_blocks import train_blocks


def samples_of(recorder):
    return [tuple(s) for it in sorted(recorder.tokens) for mb in recorder.tokens[it] for s in mb]


def train_state(save, iteration):
    path = os.path.join(save, f"iter_{iteration:07d}", "metadata.json")
    return json.loads(open(path).read())["train_state"]


def test_more_samples_of_a_dataset_read_several_times_keep_the_order_already_planned(ckpt_corpus, tmp_path):
    """Two documents (593 tokens: 18 samples of 32 an epoch). A run planned for 6 steps of 4 (24 samples, two
    epochs) stops after 2; resumed for 10 steps (40 samples, three epochs), or at global batch 8, its next
    samples are those the planned run reads: rebuilt at the new size, every epoch was shuffled anew and the
    resumed job read other samples. The 16 more come after them, in a block of their own."""
    prefix, model = ckpt_corpus
    corpus = IndexedDataset(prefix)
    small = str(tmp_path / "small_text_document")
    write_dataset(small, [corpus.document(i).tolist() for i in range(2)])
    cache = str(tmp_path / "cache")

    def run(iters, *extra):
        return train(flags((small, model), iters, "--split", "1,0,0", *extra, cache=cache))

    planned = samples_of(run(6))
    for name, more in (("longer", ("--train-iters", "10")), ("wider", ("--global-batch-size", "8"))):
        save = str(tmp_path / name)
        first = samples_of(run(6, "--save", save, "--exit-interval", "2"))
        assert first == planned[:8] and train_state(save, 2)["data_blocks"] == [24]
        resumed = samples_of(run(6, "--save", save, "--load", save, *more))
        assert resumed[:16] == planned[8:24], name
        end = max(int(d[5:]) for d in os.listdir(save) if d.startswith("iter_"))
        assert train_state(save, end)["data_blocks"] == [24, 16], name


def test_a_job_that_planned_nothing_leaves_nothing_to_extend():
    """A job with nothing to train (a new data phase at its end iteration) saves [0]: the next job plans anew
    (it appended a block after the empty one, and the empty first split left the run without a loader)."""
    assert train_blocks(None, 32, [0], 8, {}) == [8]
    assert train_blocks(None, 32, [], 8, {}) == [8] and train_blocks(None, 32, [24, 16], 30, {}) == [24, 16]
