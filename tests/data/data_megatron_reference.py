"""Tiny pure-Python reference of Megatron-LM's GPT index building, written from the algorithm
descriptions (helpers.cpp loops, gpt_dataset.py), loop by loop, for comparison with the
vectorized implementation. Deliberately slow and literal."""

import math

import numpy as np


def num_epochs(tokens_per_epoch, seq_length, num_samples):
    epochs, tokens = 1, tokens_per_epoch
    while tokens < num_samples * seq_length + 1:
        tokens += tokens_per_epoch
        epochs += 1
    return epochs


def document_index(documents, epochs, rng, separate_final):
    if not separate_final or epochs == 1:
        idx = np.mgrid[0:epochs, 0:len(documents)][1]
        idx[:] = documents
        idx = idx.reshape(-1).astype(np.int32)
        rng.shuffle(idx)
        return idx
    first = document_index(documents, epochs - 1, rng, False)
    last = document_index(documents, 1, rng, False)
    return np.concatenate((first, last))


def sample_index(sizes, doc_idx, seq_length, epochs, tokens_per_epoch):
    num_samples = (epochs * tokens_per_epoch - 1) // seq_length
    out = [(0, 0)]
    di, off = 0, 0
    while len(out) <= num_samples:
        remaining = seq_length + 1
        while remaining != 0:
            length = int(sizes[doc_idx[di]]) - off
            remaining -= length
            if remaining <= 0:
                off += remaining + length - 1
                remaining = 0
            else:
                if di == len(doc_idx) - 1:
                    off = int(sizes[doc_idx[di]]) - 1
                    break
                di += 1
                off = 0
        out.append((di, off))
    return out


def shuffle_index(num_samples, total, rng):
    first = np.arange(0, num_samples, 1, dtype=np.uint32)
    rng.shuffle(first)
    if num_samples == total:
        return first
    last = np.arange(num_samples, total, 1, dtype=np.uint32)
    rng.shuffle(last)
    return np.concatenate((first, last))


def gpt_samples(seqs, documents, seq_length, num_samples, seed):
    """All samples (lists of seq_length+1 ids, in shuffled order) Megatron's GPTDataset yields."""
    sizes = [len(s) for s in seqs]
    tpe = sum(sizes[d] for d in documents)
    epochs = num_epochs(tpe, seq_length, num_samples)
    separate = False
    before = 0
    if epochs > 1:
        before = ((epochs - 1) * tpe - 1) // seq_length
        from_final = num_samples - before
        per_epoch = (tpe - 1) // seq_length
        separate = from_final < int(0.80 * per_epoch)
    rng = np.random.RandomState(seed)
    doc_idx = document_index(np.array(documents), epochs, rng, separate)
    samp = sample_index(sizes, doc_idx, seq_length, epochs, tpe)
    total = len(samp) - 1
    shuf = shuffle_index(before if separate else total, total, rng)
    result = []
    for k in range(total):
        i = int(shuf[k])
        (bd, bo), (ed, eo) = samp[i], samp[i + 1]
        if bd == ed:
            toks = list(seqs[doc_idx[bd]][bo:eo + 1])
        else:
            toks = list(seqs[doc_idx[bd]][bo:])
            for d in range(bd + 1, ed):
                toks += list(seqs[doc_idx[d]])
            toks += list(seqs[doc_idx[ed]][:eo + 1])
        result.append(toks)
    return result


def blending(weights, size):
    """The greedy interleave loop of build_blending_indices."""
    n = len(weights)
    counts = [0] * n
    di, dsi = [], []
    for s in range(size):
        x = max(float(s), 1.0)
        best = 0
        best_err = weights[0] * x - counts[0]
        for d in range(1, n):
            err = weights[d] * x - counts[d]
            if err > best_err:
                best, best_err = d, err
        di.append(best)
        dsi.append(counts[best])
        counts[best] += 1
    return di, dsi


def split_bounds(split, n):
    parts = [float(x) for x in split.split(",")]
    parts += [0.0] * (3 - len(parts))
    total = sum(parts)
    parts = [p / total for p in parts]
    out, acc = [], 0.0
    for p in parts:
        out.append(None if p == 0 else (int(round(acc * n)), int(round((acc + p) * n))))
        acc += p
    return out


def component_request(target, weight, surplus=0.005):
    return int(math.ceil(math.ceil(target * weight) * (1 + surplus)))
