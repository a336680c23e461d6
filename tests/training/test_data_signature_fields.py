"""training.data_phase: every part of a run's data (the per-split blends, the phases of a
curriculum) is in its signature, so a resume that changes it starts a new data phase; a new phase starts
its train blocks afresh and its log line names what changed."""
from types import SimpleNamespace

from megatron_zaya.data.config import DataConfig, PhaseBlend
from megatron_zaya.training.data_phase import data_changed, data_signature, enter_data_phase
from megatron_zaya.training.loop import TrainState


def signature(seq_length=64, **data):
    return data_signature(SimpleNamespace(data=DataConfig(**data), model=SimpleNamespace(seq_length=seq_length)))


def test_per_split_blends_and_phases_are_part_of_the_data():
    base = signature(train_data_path=["t1"], valid_data_path=["v"])
    assert not data_changed(base, signature(train_data_path=["t1"], valid_data_path=["v"]))
    assert data_changed(base, signature(train_data_path=["t2"], valid_data_path=["v"]))
    assert data_changed(base, signature(train_data_path=["t1"], valid_data_path=["w"]))
    phases = [PhaseBlend(["a"], train_samples=100), PhaseBlend(["b"], train_samples=50)]
    curriculum = signature(data_path=["a"], phases=phases)
    assert not data_changed(curriculum, signature(data_path=["a"], phases=list(phases)))
    assert data_changed(curriculum, signature(data_path=["a"], phases=[phases[0],
                                                                       PhaseBlend(["c"], train_samples=50)]))
    assert data_changed(curriculum, signature(data_path=["a"], phases=[phases[0],
                                                                       PhaseBlend(["b"], train_samples=80)]))


def test_a_new_data_phase_starts_its_train_blocks_afresh_and_names_the_change():
    """The train blocks (the phase's dataset sizes across jobs, data/train_blocks.py) belong to the old data;
    the log line names the fields that changed, and only those."""
    old, new = signature(data_path=["a"]), signature(data_path=["a"], seq_length=128)
    state = TrainState(iteration=3, consumed_samples=12, data_signature=old, data_blocks=[40, 7])
    note = enter_data_phase(state, new)
    assert note.startswith("WARNING: data changed since the checkpoint (seq_length): a new data phase starts at "
                           "iteration 3")        # (a read again: its samples are cut anew)
    assert state.data_blocks == [] and (state.data_start_iteration, state.data_start_samples) == (3, 12)
    assert state.data_signature == new
    kept = TrainState(iteration=3, consumed_samples=12, data_signature=new, data_blocks=[40, 7])
    assert enter_data_phase(kept, new) is None and kept.data_blocks == [40, 7]
