"""A Hugging Face export (to-hf, average) into a symlink to an empty folder (a link into scratch space on another
mount) lands in the folder the link names, its temporary folder written beside that folder, and the link stays:
it failed at the very end with "Not a directory" (rmdir on the link), after every weight was read and written.
A link to a folder not made yet is refused first, as training's output folders are.

    python -m pytest -q tests/checkpoint/test_hf_export_symlink.py
"""
import os
import tempfile

import torch

from ckpt_harness import convert_tool
from megatron_zaya.checkpoint import hf_format
from megatron_zaya.checkpoint.hf_format import is_hf_folder, load_hf_folder, save_hf_folder
from megatron_zaya.config import model_config_from_preset
from megatron_zaya.model import ZayaModel




def _linked_empty_folder(tmp_path, name):
    """tmp_path/name -> tmp_path/scratch/name_target (empty), the link relative as `ln -s` users often make it."""
    target = tmp_path / "scratch" / f"{name}_target"
    target.mkdir(parents=True)
    (tmp_path / name).symlink_to(os.path.join("scratch", f"{name}_target"))
    return tmp_path / name, target


def test_an_export_into_a_symlink_lands_in_its_folder_and_the_link_stays(tmp_path, capsys, monkeypatch):
    config = model_config_from_preset("zaya1-tiny", num_layers=1, hidden_size=32, num_attention_heads=2,
                                      num_query_groups=2, kv_channels=16, vocab_size=128, num_experts=2,
                                      moe_ffn_hidden_size=32, router_hidden_size=8, seq_length=16)
    torch.manual_seed(0)
    state = ZayaModel(config).state_dict()
    save_hf_folder(state, config, tmp_path / "src")
    tool = convert_tool()
    temporary_parents, mkdtemp = [], tempfile.mkdtemp

    def recorded_mkdtemp(*args, **kwargs):
        temporary_parents.append(os.path.realpath(kwargs["dir"]))
        return mkdtemp(*args, **kwargs)
    monkeypatch.setattr(hf_format.tempfile, "mkdtemp", recorded_mkdtemp)
    ckpts = [str(tmp_path / "ckpt1"), str(tmp_path / "ckpt2")]
    for ckpt in ckpts:
        assert tool.main(["from-hf", str(tmp_path / "src"), ckpt, "--no-progress"]) == 0
    outputs = []
    for name, argv in (("hflink", ["to-hf", ckpts[0]]), ("slashlink", ["to-hf", ckpts[0]]),
                       ("avlink", ["average", *ckpts])):
        link, target = _linked_empty_folder(tmp_path, name)
        output = f"{link}/" if name == "slashlink" else str(link)
        capsys.readouterr()
        assert tool.main([*argv, output, "--no-progress"]) == 0, capsys.readouterr().err
        assert link.is_symlink() and os.path.realpath(link) == str(target), name
        assert is_hf_folder(target), name
        outputs.append(target)
        # beside the target (one file system: a link into another mount renames within it), not beside the link
        assert temporary_parents[-1] == str(target.parent), name
    assert sorted(os.listdir(tmp_path / "scratch")) == ["avlink_target", "hflink_target", "slashlink_target"]
    assert not [n for n in os.listdir(tmp_path) if ".tmp" in n]
    # A link to a folder not made yet: refused before any weight is read, naming the link and its target (as
    # training's output folders are), the link left as it is
    (tmp_path / "dangling").symlink_to(tmp_path / "scratch" / "not_yet")
    for output, command in ((tmp_path / "dangling", "to-hf"), (tmp_path / "dangling" / "sub", "to-hf"),
                            (tmp_path / "dangling", "from-hf")):      # (from-hf's source: the first export)
        capsys.readouterr()
        source = ckpts[0] if command == "to-hf" else str(outputs[0])
        try:
            status = tool.main([command, source, str(output), "--no-progress"])
        except SystemExit as stopped:         # (from-hf: a usage error of the output's kind, as argparse's)
            status = stopped.code
        assert status == 2, command
        assert (f"{tmp_path / 'dangling'} is a symbolic link to {tmp_path / 'scratch' / 'not_yet'}, which does not "
                f"exist") in capsys.readouterr().err
    assert (tmp_path / "dangling").is_symlink() and not (tmp_path / "scratch" / "not_yet").exists()
    for target in outputs:
        loaded, _ = load_hf_folder(target)
        assert sorted(loaded) == sorted(state)
        for name, tensor in state.items():
            assert torch.equal(loaded[name], tensor), (target, name)
