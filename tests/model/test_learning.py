"""A tiny model's loss falls clearly on real English text within about a hundred CPU steps.

The text is Python's own documentation (pydoc_data.topics, shipped with every CPython), as bytes."""
import math

import torch
from pydoc_data.topics import topics

from megatron_zaya.config import model_config_from_preset
from megatron_zaya.model import ZayaModel


def test_loss_falls_on_real_text():
    text = "\n\n".join(topics[k] for k in sorted(topics)).encode("utf-8")
    data = torch.tensor(list(text[:400_000]), dtype=torch.long)
    torch.manual_seed(0)
    config = model_config_from_preset("zaya1-tiny", vocab_size=256, num_layers=2, seq_length=64)
    model = ZayaModel(config)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    gen = torch.Generator().manual_seed(0)
    losses = []
    # 120 steps: the mean of the last 10 losses is ~2.35 nats there (2.03 after 200), the bound ~2.76.
    for step in range(120):
        starts = torch.randint(0, len(data) - 65, (16,), generator=gen)
        batch = torch.stack([data[s: s + 65] for s in starts])
        out = model(batch[:, :-1], labels=batch[:, 1:])
        loss = out.token_losses.float().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    freq = torch.bincount(data, minlength=256).double() / len(data)
    unigram_entropy = -(freq[freq > 0] * freq[freq > 0].log()).sum().item()   # ~3 nats for English bytes
    last = sum(losses[-10:]) / 10
    assert losses[0] > 0.9 * math.log(256)            # starts near uniform over bytes
    assert last < unigram_entropy - 0.5, (losses[0], last, unigram_entropy)
