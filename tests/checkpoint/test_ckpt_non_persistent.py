"""Megatron-LM's non-persistent checkpoints (--non-persistent-save-interval, type "global"): written
into --save between the --save-interval ones, each removed once a newer checkpoint of either kind
is complete, never counted by --ckpt-keep; the end of training keeps its last one as persistent; a
crashed run resumes from the newest one exactly."""
import json
import os

import pytest

from ckpt_harness import flags, train
from megatron_zaya.arguments import parse_args
from megatron_zaya.checkpoint.format import METADATA_FILE, list_complete


def non_persistent(save, iteration) -> bool:
    return json.load(open(os.path.join(save, f"iter_{iteration:07d}", METADATA_FILE)))["non_persistent"]


@pytest.mark.parametrize("async_save", [False, True])
def test_non_persistent_saves_are_superseded_and_the_last_one_kept(ckpt_corpus, ckpt_cache, tmp_path, capsys,
                                                                   async_save):
    save = str(tmp_path / "ckpt")
    train(flags(ckpt_corpus, 6, "--save", save, "--save-interval", "4", "--non-persistent-save-interval", "1",
                *(["--async-save"] if async_save else []), cache=ckpt_cache))
    captured = capsys.readouterr()
    out = captured.out + captured.err       # the saver's removals are logged to stderr
    for it in (1, 2, 3, 5):      # each written, then removed by the next save
        written = f"{save}/iter_{it:07d} complete" if async_save else f"saved checkpoint {save}/iter_{it:07d} (non-persistent)"
        assert written in out, out
        assert f"removed old checkpoint {save}/iter_{it:07d} (superseded non-persistent checkpoint)" in out
    assert list_complete(save) == [4, 6]
    assert not non_persistent(save, 4) and not non_persistent(save, 6)      # 6 promoted at the end of training
    assert f"kept the non-persistent checkpoint {save}/iter_0000006 as a persistent one (end of training)" in out


def test_ckpt_keep_counts_persistent_checkpoints_only(ckpt_corpus, ckpt_cache, tmp_path):
    save = str(tmp_path / "ckpt")
    train(flags(ckpt_corpus, 7, "--save", save, "--save-interval", "2", "--non-persistent-save-interval", "1",
                "--ckpt-keep", "2", cache=ckpt_cache))
    assert list_complete(save) == [6, 7]        # 2 and 4 pruned by --ckpt-keep 2; 1, 3, 5 superseded


def test_a_crashed_run_resumes_from_its_newest_non_persistent_checkpoint(ckpt_corpus, ckpt_cache, tmp_path):
    """The state a crash after iteration 5 leaves (persistent 4, non-persistent 5): the resume loads 5,
    its step 6 equals the uninterrupted run's, and its first save removes 5."""
    full = train(flags(ckpt_corpus, 6, cache=ckpt_cache))
    save = str(tmp_path / "ckpt")
    train(flags(ckpt_corpus, 6, "--save", save, "--save-interval", "4", "--non-persistent-save-interval", "1",
                "--exit-interval", "5", cache=ckpt_cache))      # the same schedule as the full run, stopped at 5
    meta_path = os.path.join(save, "iter_0000005", METADATA_FILE)
    meta = json.load(open(meta_path))
    json.dump(dict(meta, non_persistent=True), open(meta_path, "w"))     # as if the run died before its end
    resumed = train(flags(ckpt_corpus, 6, "--load", save, "--save", save, "--save-interval", "4",
                          "--non-persistent-save-interval", "1", cache=ckpt_cache))
    assert resumed.losses == {6: full.losses[6]}
    assert list_complete(save) == [4, 6]


def test_a_run_that_died_before_keeping_its_last_checkpoint_keeps_it_when_run_again(ckpt_corpus, ckpt_cache,
                                                                                    tmp_path):
    """Killed after its non-persistent save at the last iteration but before the end of training kept it: run
    again, there is nothing to train, and the end of training keeps it as persistent (it stayed marked
    non-persistent and the next continuation removed it as superseded)."""
    save = str(tmp_path / "ckpt")
    again = flags(ckpt_corpus, 4, "--load", save, "--save", save, "--non-persistent-save-interval", "2",
                  cache=ckpt_cache)
    train(again)
    meta_path = os.path.join(save, "iter_0000004", METADATA_FILE)
    json.dump(dict(json.load(open(meta_path)), non_persistent=True), open(meta_path, "w"))   # as the kill left it
    assert not train(again).losses and not non_persistent(save, 4)
    train(flags(ckpt_corpus, 6, *again[again.index("--load"):], cache=ckpt_cache))
    assert list_complete(save) == [4, 6]


@pytest.mark.parametrize("extra, expected", [
    (["--non-persistent-ckpt-type", "local"], "--non-persistent-ckpt-type local is not supported"),
    (["--non-persistent-global-ckpt-dir", "/tmp/elsewhere"], "non-persistent checkpoints are kept in --save here"),
])
def test_non_persistent_flag_errors_name_the_flag(ckpt_corpus, ckpt_cache, tmp_path, capsys, extra, expected):
    with pytest.raises(SystemExit):
        parse_args(flags(ckpt_corpus, 2, "--save", str(tmp_path / "ckpt"), "--non-persistent-save-interval", "1",
                         *extra, cache=ckpt_cache))
    assert expected in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(flags(ckpt_corpus, 2, "--non-persistent-save-interval", "1", cache=ckpt_cache))
    assert "--non-persistent-save-interval needs --save" in capsys.readouterr().err
