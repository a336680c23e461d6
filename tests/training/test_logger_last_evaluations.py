"""TrainingLogger.evaluation_scalars at a run's last iteration: written once across jobs, and again after a job
resumed from an older checkpoint has dropped the points past it."""
import json

from tests.training.test_training_run import scalars

from megatron_zaya.training.logger import LAST_EVALUATIONS_FILE, TrainingLogger


def _job(tb, start, purge=True):
    return TrainingLogger(True, str(tb), total_iters=6, start_iter=start, purge=purge, start_samples=4 * start)


def test_the_last_iterations_evaluation_is_written_once_and_again_after_a_purge(tmp_path):
    tb = tmp_path / "tb"
    first = _job(tb, 0)
    first.evaluation_scalars("validation", {"lm loss validation": 1.0}, 3, 12)      # not the last iteration
    first.evaluation_scalars("validation", {"lm loss validation": 2.0}, 6, 24)
    first.close()
    assert json.loads((tb / LAST_EVALUATIONS_FILE).read_text()) == {"validation": 6}
    finished = _job(tb, 6, purge=False)          # a finished run started again: evaluates, writes nothing new
    finished.evaluation_scalars("validation", {"lm loss validation": 2.5}, 6, 24)
    finished.evaluation_scalars("test", {"lm loss test": 3.0}, 6, 24)               # the test was never written
    finished.close()
    assert scalars(tb)["lm loss validation"] == [(3, 1.0), (6, 2.0)] and scalars(tb)["lm loss test"] == [(6, 3.0)]
    resumed = _job(tb, 3)                        # from iteration 3: the points past it, and their records, go
    assert json.loads((tb / LAST_EVALUATIONS_FILE).read_text()) == {}
    resumed.evaluation_scalars("validation", {"lm loss validation": 4.0}, 6, 24)
    resumed.close()
    assert json.loads((tb / LAST_EVALUATIONS_FILE).read_text()) == {"validation": 6}


def test_a_run_from_iteration_0_into_a_folder_with_events_says_it_hides_them(tmp_path, capsys):
    """A new run (iteration 0) writing into another run's --tensorboard-dir purges its points from view (the
    files stay): a warning names the folder. A resume (iteration > 0) and a first run into an empty folder: none."""
    tb = tmp_path / "tb"
    _job(tb, 0).close()
    assert "WARNING" not in capsys.readouterr().out
    _job(tb, 3).close()
    assert "WARNING" not in capsys.readouterr().out
    _job(tb, 0).close()
    assert f"WARNING: --tensorboard-dir {tb} holds an earlier run's event files" in capsys.readouterr().out
