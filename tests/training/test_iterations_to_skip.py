"""--iterations-to-skip (Megatron-LM's): the steps after the listed numbers of completed iterations (N: the
step logged as iteration N + 1) read and drop their global batches, with no update, and every other
iteration sees the batch it would have seen; compared with a run without skips, and across a checkpoint
saved at the skipped iteration."""
import json

import pytest

from megatron_zaya.arguments import parse_args
from megatron_zaya.training import loop
from megatron_zaya.training.setup import build_and_train
from tests.training.helpers import tiny_run_flags
from tests.training.test_training_run import scalars


REAL_STEP = loop.Trainer.train_step


def run(tiny_corpus, tmp_path, name, monkeypatch, **extra):
    """(token batches the train steps saw, TensorBoard scalars by tag as {step: value})."""
    seen, real_step = [], REAL_STEP

    def train_step(trainer, micro_batches):
        seen.append([b["tokens"].tolist() for b in micro_batches])
        return real_step(trainer, micro_batches)
    monkeypatch.setattr(loop.Trainer, "train_step", train_step)
    tb = tmp_path / name
    flags = tiny_run_flags(tiny_corpus, tmp_path, **{"--train-iters": 5, "--eval-iters": 0, "--tensorboard-dir": tb,
                                                     **extra})
    assert build_and_train(parse_args(flags)) == 0
    return seen, {tag: dict(points) for tag, points in scalars(tb).items()}


def test_a_skipped_iteration_drops_its_batch_and_makes_no_update(tiny_corpus, tmp_path, monkeypatch, capsys):
    plain_batches, plain = run(tiny_corpus, tmp_path, "plain", monkeypatch)
    batches, skipped = run(tiny_corpus, tmp_path, "skip", monkeypatch, **{"--iterations-to-skip": 2})
    assert "iteration        3/       5 | SKIPPED (--iterations-to-skip): its 4 samples dropped" in capsys.readouterr().out
    assert batches == plain_batches[:2] + plain_batches[3:]          # batch 3 read and dropped, order kept
    assert sorted(skipped["lm loss"]) == [1, 2, 4, 5]
    assert [skipped["lm loss"][i] for i in (1, 2)] == [plain["lm loss"][i] for i in (1, 2)]
    assert skipped["lm loss"][4] != pytest.approx(plain["lm loss"][4], rel=1e-6)   # weights missed step 3
    assert skipped["skipped-train-samples"] == {3: 4}
    assert skipped["consumed-samples"][3] == 12 and skipped["consumed-samples"][5] == 20
    # the dropped batch's tokens count as consumed, as its samples do: 32 tokens per sample either side of it
    tokens = {i: 4 * 32 * i for i in (1, 2, 4, 5)}
    assert {i: skipped["consumed-tokens"][i] for i in tokens} == tokens
    assert {i: plain["consumed-tokens"][i] for i in tokens} == tokens
    # no update at iteration 3: the schedule did not move, so iteration 4 uses iteration 3's lr
    assert skipped["learning-rate"][4] == pytest.approx(plain["learning-rate"][3], rel=1e-6)


def test_a_checkpoint_at_a_skipped_iteration_resumes_exactly(tiny_corpus, tmp_path, monkeypatch):
    _, straight = run(tiny_corpus, tmp_path, "straight", monkeypatch, **{"--iterations-to-skip": [2, 3]})
    save = tmp_path / "ckpt"
    skip = {"--iterations-to-skip": [2, 3], "--save": save, "--save-interval": 3}
    run(tiny_corpus, tmp_path, "first", monkeypatch, **{**skip, "--exit-interval": 3})
    assert (save / "iter_0000003").is_dir()
    _, resumed = run(tiny_corpus, tmp_path, "resumed", monkeypatch, **{**skip, "--load": save})
    assert sorted(resumed["lm loss"]) == [5]
    assert resumed["lm loss"][5] == straight["lm loss"][5]
    assert resumed["skipped-train-samples"] == {4: 8}
    saved = json.loads((save / "iter_0000003" / "metadata.json").read_text())["train_state"]
    assert (saved["consumed_samples"], saved["consumed_tokens"]) == (12, 12 * 32)    # iteration 3 skipped
    assert resumed["consumed-tokens"][5] == straight["consumed-tokens"][5] == 20 * 32


def test_zero_skips_the_first_step_and_negatives_are_refused(tiny_corpus, tmp_path, monkeypatch, capsys):
    """0 is the first step (no iteration completed), as in Megatron-LM; the run ends at 5 completed iterations,
    so 5 is never reached."""
    plain_batches, _ = run(tiny_corpus, tmp_path, "plain", monkeypatch)
    batches, _ = run(tiny_corpus, tmp_path, "first", monkeypatch, **{"--iterations-to-skip": 0})
    assert "iteration        1/       5 | SKIPPED" in capsys.readouterr().out and batches == plain_batches[1:]
    with pytest.raises(SystemExit):
        parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--iterations-to-skip": -1}))
    assert "--iterations-to-skip -1: a number of completed iterations, >= 0" in capsys.readouterr().err
    run_config = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--train-iters": 5, "--iterations-to-skip": 5}))
    assert any("never reaching it" in w for w in run_config.warnings)
    # --train-samples with --load: the end is counted from the checkpoint's position, known only after the load
    resumed = parse_args(tiny_run_flags(tiny_corpus, tmp_path, **{"--train-iters": None, "--train-samples": 8,
                                                                 "--iterations-to-skip": 3, "--load": tmp_path / "c"}))
    assert not any("never reaching it" in w for w in resumed.warnings)
