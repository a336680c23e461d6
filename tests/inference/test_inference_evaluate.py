"""tools/evaluate.py and megatron_zaya.inference.evaluation: loss and perplexity against an independent
computation over the same validation samples, routing statistics, TensorBoard output."""
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from megatron_zaya.data import DataConfig, IndexedDatasetWriter, build_tokenizer, build_train_valid_test_datasets
from megatron_zaya.inference.evaluation import EvalResult, LayerRoutingStats, evaluate

from inference_helpers import hf_checkpoint, load_tool, one_cpu_thread, tiny_model  # noqa: F401 (fixtures)

SEQ = 32


@pytest.fixture(scope="module")
def dataset_prefix(tmp_path_factory):
    prefix = str(tmp_path_factory.mktemp("evaldata") / "docs_text_document")
    rng = np.random.default_rng(0)
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        for _ in range(40):
            doc = rng.integers(0, 7999, size=int(rng.integers(10, 60))).tolist() + [8000]   # EOD = 8000
            writer.add_document(doc)
    return prefix


def validation_samples(prefix, n, packed=False):
    cfg = DataConfig(data_path=[prefix], split="60,40,0", seed=1234, num_workers=0,
                     tokenizer_type="NullTokenizer", tokenizer_model="8000", reset_attention_mask=packed,
                     reset_position_ids=packed)
    tok = build_tokenizer("NullTokenizer", "8000")
    valid = build_train_valid_test_datasets(cfg, SEQ, [0, n, 0], tok)[1]
    return [valid[i] for i in range(n)]


def test_evaluate_tool_matches_independent_loss(tiny_model, hf_checkpoint, dataset_prefix, tmp_path, capsys):
    out_json, tb = tmp_path / "eval.json", tmp_path / "tb"
    tool = load_tool("evaluate")
    assert tool.main(["--load", str(hf_checkpoint), "--data-path", dataset_prefix, "--split", "60,40,0",
                      "--tokenizer-type", "NullTokenizer", "--tokenizer-model", "8000", "--seq-length", str(SEQ),
                      "--micro-batch-size", "3", "--eval-iters", "3", "--output-json", str(out_json),
                      "--tensorboard-dir", str(tb), "--step", "7"]) == 0
    report = json.loads(out_json.read_text())
    samples = validation_samples(dataset_prefix, 9)
    tokens = torch.stack([torch.from_numpy(s["tokens"]) for s in samples])
    labels = torch.stack([torch.from_numpy(s["labels"]) for s in samples])
    with torch.no_grad():
        out = tiny_model(tokens)
    expected = F.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]).double(), labels.reshape(-1)).item()
    assert report["samples"] == 9 and report["tokens"] == 9 * SEQ
    assert report["loss"] == pytest.approx(expected, abs=1e-5)
    assert report["perplexity"] == pytest.approx(math.exp(expected), rel=1e-5)
    # Routing statistics against the model's own routing over the same tokens.
    for layer, routing in zip(report["routing"], out.routing):
        counts = routing.counts.double()
        assert layer["tokens"] == 9 * SEQ
        assert layer["load"] == pytest.approx((counts[:-1] / counts.sum()).tolist(), abs=1e-12)
        assert layer["skip_rate"] == pytest.approx((counts[-1] / counts.sum()).item(), abs=1e-12)
        probs = routing.probs
        h = -(probs * probs.clamp_min(1e-30).log()).sum(-1).mean().item() / math.log(probs.shape[-1])
        assert layer["router_entropy"] == pytest.approx(h, rel=1e-4)
    printed = capsys.readouterr().out
    assert f"loss {report['loss']:.4f}" in printed and "skip" in printed
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(tb))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "valid/loss" in tags and "valid-routing/layer_00/skip_rate" in tags
    event = acc.Scalars("valid/loss")[0]
    assert event.step == 7 and event.value == pytest.approx(report["loss"], rel=1e-6)
    # --eval-iters counts global batches, as in training: 2 x --global-batch-size 6 = 12 samples (it was 2 x 3)
    assert tool.main(["--load", str(hf_checkpoint), "--data-path", dataset_prefix, "--split", "60,40,0",
                      "--tokenizer-type", "NullTokenizer", "--tokenizer-model", "8000", "--seq-length", str(SEQ),
                      "--micro-batch-size", "3", "--global-batch-size", "6", "--eval-iters", "2",
                      "--output-json", str(out_json)]) == 0
    samples = validation_samples(dataset_prefix, 12)
    tokens = torch.stack([torch.from_numpy(s["tokens"]) for s in samples])
    labels = torch.stack([torch.from_numpy(s["labels"]) for s in samples])
    with torch.no_grad():
        logits = tiny_model(tokens).logits
    expected = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(), labels.reshape(-1)).item()
    report = json.loads(out_json.read_text())
    assert report["samples"] == 12 and report["loss"] == pytest.approx(expected, abs=1e-5)


def test_evaluate_tool_with_packed_documents_scores_each_document_alone(tiny_model, hf_checkpoint, dataset_prefix,
                                                                       tmp_path):
    """--reset-attention-mask --reset-position-ids: the samples carry document ids, and each token's loss is
    the one its document gives alone (an independent forward per document, positions from 0)."""
    out_json = tmp_path / "eval.json"
    assert load_tool("evaluate").main([
        "--load", str(hf_checkpoint), "--data-path", dataset_prefix, "--split", "60,40,0", "--tokenizer-type",
        "NullTokenizer", "--tokenizer-model", "8000", "--seq-length", str(SEQ), "--micro-batch-size", "3",
        "--eval-iters", "2", "--reset-attention-mask", "--reset-position-ids", "--output-json", str(out_json)]) == 0
    report = json.loads(out_json.read_text())
    losses, boundaries = [], 0
    for sample in validation_samples(dataset_prefix, 6, packed=True):
        tokens, labels = torch.from_numpy(sample["tokens"]), torch.from_numpy(sample["labels"])
        starts = (torch.diff(torch.from_numpy(sample["document_ids"])) != 0).nonzero().squeeze(1) + 1
        boundaries += len(starts)
        for piece, target in zip(torch.tensor_split(tokens, starts), torch.tensor_split(labels, starts)):
            with torch.no_grad():
                logits = tiny_model(piece[None]).logits[0].double()
            losses.append(F.cross_entropy(logits, target, reduction="none"))
    assert boundaries >= 3 and report["samples"] == 6
    assert report["loss"] == pytest.approx(torch.cat(losses).mean().item(), abs=1e-5)


def test_default_is_one_pass_over_the_validation_split(hf_checkpoint, dataset_prefix, tmp_path):
    tool = load_tool("evaluate")
    out_json = tmp_path / "eval.json"
    assert tool.main(["--load", str(hf_checkpoint), "--data-path", dataset_prefix, "--split", "60,40,0",
                      "--tokenizer-type", "NullTokenizer", "--tokenizer-model", "8000", "--seq-length", str(SEQ),
                      "--micro-batch-size", "4", "--output-json", str(out_json)]) == 0
    from megatron_zaya.data.indexed import IndexedDataset
    ds = IndexedDataset(dataset_prefix)
    valid_tokens = int(np.asarray(ds.sequence_lengths, dtype=np.int64)[24:40].sum())   # split 60,40 of 40 docs
    assert json.loads(out_json.read_text())["samples"] == (valid_tokens - 1) // SEQ
    with pytest.raises(SystemExit):
        tool.main(["--load", str(hf_checkpoint), "--data-path", str(tmp_path / "nope"),
                   "--tokenizer-type", "NullTokenizer", "--tokenizer-model", "8000"])


def test_loss_is_token_weighted_and_masks_apply(tiny_model):
    torch.manual_seed(0)
    tokens = torch.randint(0, 8000, (5, 16))
    labels = torch.randint(0, 8000, (5, 16))
    mask = (torch.rand(5, 16) > 0.3).float()
    batches = [{"tokens": tokens[:2], "labels": labels[:2], "loss_mask": mask[:2]},
               {"tokens": tokens[2:], "labels": labels[2:], "loss_mask": mask[2:]}]
    result = evaluate(tiny_model, batches)
    with torch.no_grad():
        logits = tiny_model(tokens).logits
    per_token = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
    expected = (per_token * mask.reshape(-1)).sum() / mask.sum()
    assert result.loss == pytest.approx(expected.item(), rel=1e-5)
    assert result.loss_tokens == mask.sum().item() and result.samples == 5


def test_routing_statistics_formulas():
    balanced = LayerRoutingStats(torch.tensor([25, 25, 25, 25, 0]))
    assert balanced.load_entropy == pytest.approx(1.0) and balanced.max_load == pytest.approx(1.0)
    assert balanced.skip_rate == 0.0
    collapsed = LayerRoutingStats(torch.tensor([0, 60, 0, 0, 40]))
    assert collapsed.load_entropy == pytest.approx(0.0, abs=1e-9) and collapsed.max_load == pytest.approx(4.0)
    assert collapsed.skip_rate == pytest.approx(0.4) and collapsed.load == pytest.approx([0, 0.6, 0, 0])
    assert math.isnan(EvalResult().loss)


def test_seq_length_beyond_the_checkpoint_positions_is_refused(hf_checkpoint, dataset_prefix, tiny_model, capsys):
    """pretrain_zaya.py refuses --seq-length > max_position_embeddings; so does evaluate.py."""
    too_long = tiny_model.config.max_position_embeddings + 64
    with pytest.raises(SystemExit) as exc:
        load_tool("evaluate").main(["--load", str(hf_checkpoint), "--data-path", dataset_prefix, "--split", "60,40,0",
                                    "--tokenizer-type", "NullTokenizer", "--tokenizer-model", "8000",
                                    "--seq-length", str(too_long), "--micro-batch-size", "1", "--eval-iters", "1"])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert exc.value.code == 2 and f"--seq-length={too_long}" in line and "max-position-embeddings" in line, line


@pytest.mark.parametrize("extra, expected", [(["--split=-5,10,1"], "--split"), (["--split", "abc"], "--split"),
                                             (["--tokenizer-model", "x"], "--tokenizer-model 'x'"),
                                             (["--eval-iters", "0"], "--eval-iters=0"),
                                             # a traceback after the load, from the dataset's shuffle
                                             (["--seed", "-1"], "--seed=-1 must be in [0, 2**32 - 1]")])
def test_evaluate_flags_are_checked_before_loading(dataset_prefix, tmp_path, capsys, extra, expected):
    argv = ["--load", str(tmp_path / "not_loaded"), "--data-path", dataset_prefix,
            "--tokenizer-type", "NullTokenizer", "--tokenizer-model", "8000"]
    with pytest.raises(SystemExit) as exc:
        load_tool("evaluate").main(argv + extra)
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert exc.value.code == 2 and expected in line and "--load" not in line, line


def test_evaluate_refuses_an_output_json_inside_the_checkpoint_it_loads(dataset_prefix, tmp_path, capsys):
    """--output-json ckpt/iter_N/metadata.json replaced the checkpoint's metadata, which then no longer loaded."""
    load = tmp_path / "ckpt" / "iter_0000002"
    load.mkdir(parents=True)
    with pytest.raises(SystemExit) as exc:
        load_tool("evaluate").main(["--load", str(load.parent), "--data-path", dataset_prefix, "--tokenizer-type",
                                    "NullTokenizer", "--tokenizer-model", "8000", "--output-json",
                                    str(load / "metadata.json")])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert exc.value.code == 2 and "inside the --load folder" in line, line


@pytest.mark.parametrize("gone", ["stdout", "both"])
def test_evaluate_whose_reader_left_still_writes_its_results(hf_checkpoint, dataset_prefix, tmp_path, gone):
    """stdout's reader gone at once (`| head`, a dead tee), or stderr's too (`2>&1 | head`, with progress lines):
    the evaluation goes on and --output-json is written (a BrokenPipeError at the first print lost it)."""
    import os
    import subprocess
    import sys
    out_json = tmp_path / "eval.json"
    read, write = os.pipe()
    os.close(read)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, os.path.join(root, "tools", "evaluate.py"), "--load", str(hf_checkpoint),
                           "--data-path", dataset_prefix, "--split", "60,40,0", "--tokenizer-type", "NullTokenizer",
                           "--tokenizer-model", "8000", "--seq-length", str(SEQ), "--eval-iters", "2",
                           "--log-interval", "1", "--output-json", str(out_json)], stdout=write,
                          stderr=write if gone == "both" else subprocess.PIPE, text=True,
                          timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"))
    os.close(write)
    errors = proc.stderr or ""
    assert proc.returncode == 0 and "Traceback" not in errors, (proc.returncode, errors[-2000:])
    assert json.loads(out_json.read_text())["samples"] > 0


def test_evaluate_names_a_blend_member_whose_split_is_empty(hf_checkpoint, dataset_prefix, tmp_path, capsys):
    """A small dataset of a blend with nothing in the split: one error line, not a traceback after the load."""
    small = str(tmp_path / "small_text_document")
    with IndexedDatasetWriter(small, np.uint16) as writer:
        writer.add_document([1, 2, 3, 8000])
    with pytest.raises(SystemExit) as stopped:
        load_tool("evaluate").main(["--load", str(hf_checkpoint), "--data-path", "0.9", dataset_prefix, "0.1", small,
                                    "--split", "60,40,0", "--tokenizer-type", "NullTokenizer", "--tokenizer-model",
                                    "8000", "--seq-length", str(SEQ), "--eval-iters", "2"])
    assert stopped.value.code == 2
    assert "small_text_document" in capsys.readouterr().err


def test_per_dataset_tensorboard_has_each_sets_own_scalars(hf_checkpoint, dataset_prefix, tmp_path):
    """--per-dataset --tensorboard-dir: each dataset's loss and routing under valid/<its name>, at --step,
    the values of its entry in the JSON report, which are those of evaluating it alone."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    other = str(tmp_path / "other_text_document")
    rng = np.random.default_rng(1)
    with IndexedDatasetWriter(other, np.uint16) as writer:
        for _ in range(30):
            writer.add_document(rng.integers(0, 7999, size=int(rng.integers(10, 60))).tolist() + [8000])
    common = ["--load", str(hf_checkpoint), "--split", "60,40,0", "--tokenizer-type", "NullTokenizer",
              "--tokenizer-model", "8000", "--seq-length", str(SEQ), "--micro-batch-size", "3", "--eval-iters", "2"]
    tool = load_tool("evaluate")
    tb, out_json = tmp_path / "tb", tmp_path / "eval.json"
    assert tool.main(common + ["--data-path", dataset_prefix, other, "--per-dataset", "--tensorboard-dir", str(tb),
                               "--step", "11", "--output-json", str(out_json)]) == 0
    sets = json.loads(out_json.read_text())["datasets"]
    assert len(sets) == 2
    acc = EventAccumulator(str(tb))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    for (name, entry), prefix in zip(sets.items(), (dataset_prefix, other)):
        loss = acc.Scalars(f"valid/{name}/loss")
        assert [e.step for e in loss] == [11] and loss[0].value == pytest.approx(entry["loss"], rel=1e-6)
        assert f"valid/{name}-routing/layer_00/skip_rate" in tags
        alone = tmp_path / f"alone_{name}.json"
        assert tool.main(common + ["--data-path", prefix, "--output-json", str(alone)]) == 0
        assert json.loads(alone.read_text())["loss"] == pytest.approx(entry["loss"], abs=1e-6)
    assert sets[list(sets)[0]]["loss"] != pytest.approx(sets[list(sets)[1]]["loss"], abs=1e-4)
