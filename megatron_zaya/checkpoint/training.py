"""The training loop's checkpointing and fault-tolerance hooks (see docs/CHECKPOINTING.md).

`TrainingCheckpointer(run, runtime)` is always constructed: besides --save / --load it owns the
SIGTERM / SIGUSR1 / SIGINT handlers (save, then a clean exit) and the per-rank watchdog.

    load(trainer)        before the data loaders: model, optimizer, RNG, TrainState, balancing biases
    after_step(trainer)  heartbeat; --save-interval (else --non-persistent-save-interval); a signal on
                         any rank -> save + stop
    on_exit(trainer)     early exit (exit interval / duration / signal): save unless just saved
    finalize(trainer)    end of training: save unless just saved; wait for the async save
    close()              always (setup.py's finally): wait for a save in flight, stop the watchdog
"""
from __future__ import annotations

import copy
import dataclasses
import os
import random
import sys
import time

import torch

from megatron_zaya.checkpoint.format import (CheckpointError, CheckpointFolder, checkpoint_candidates, iter_dir_name,
                                             list_complete, read_folder_metadata, read_rank_meta,
                                             unreadable_latest_file)
from megatron_zaya.checkpoint.preflight import (HUB_LOAD_STEPS, WEIGHTS_ONLY_ADVICE, check_model_config,
                                                check_weights_only, loads_optimizer, missing_checkpoint_message,
                                                no_pretrained_checkpoint_message, requires_checkpoint, start_sources)
from megatron_zaya.checkpoint.saver import CheckpointWriter, publish_interrupted, recover_replaced
from megatron_zaya.checkpoint.state import (balancer_entries, load_balancer, load_model, load_optimizer, load_rng,
                                            load_saved_masters, model_entries, optimizer_entries, optimizer_slots,
                                            rng_entries_and_objects, unwrap)
from megatron_zaya.errors import hub_name_hint
from megatron_zaya.optim.schedules import flag_value_text, schedule_flags_of
from megatron_zaya.training.data_phase import enter_run_data_phase
from megatron_zaya.training.progress_log import ProgressLog
from megatron_zaya.units import timestamp
from megatron_zaya.training.signals import SignalMonitor
from megatron_zaya.training.watchdog import Watchdog

SIGNAL_CODES = {"SIGTERM": 1, "SIGUSR1": 2, "SIGINT": 3}


def _jsonable(value):
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


def sync_masters_from_model(optimizer, model) -> None:
    """ZeRO-1 fp32 masters := the (just loaded) parameters, for loads that skip the optimizer
    (DistributedMuon's masters of bf16 weights are made again from them at the next step)."""
    for slot in optimizer_slots(optimizer, model):
        if slot.kind == "owner":
            for state in slot.container.state.values():
                state.pop("master", None)
        dist_opt = slot.distributed
        if dist_opt is None:
            continue
        with torch.no_grad():
            for p, a, b, m in dist_opt.pieces:
                m.copy_(p.detach().reshape(-1)[a:b].float())


def require_optimizer_state(folder: CheckpointFolder) -> None:
    """A run that loads the optimizer needs a checkpoint saved with one: one written by training
    (optimizer classes recorded, even before any state exists) or with `optim/` tensors."""
    saved_by_training = any(rf.meta["objects"].get("optimizer", {}).get("classes") for rf in folder.ranks)
    if not (saved_by_training or folder.keys("optim/")):
        raise CheckpointError(f"{folder.folder}: holds no optimizer state; {WEIGHTS_ONLY_ADVICE}")


def optimizer_state_gaps(model, folder: CheckpointFolder) -> list[str]:
    """A warning naming the trained parameters the checkpoint has no optimizer state for (they start
    with fresh state), or nothing. Every rank sees the same names."""
    with_state = {key[len("optim/"):].rpartition("/")[0] for key in folder.keys("optim/")}
    trained = [name for name, p in unwrap(model).named_parameters() if p.requires_grad]
    missing = [name for name in trained if name not in with_state]
    if not missing:
        return []
    return [f"no optimizer state in the checkpoint for {len(missing)} of {len(trained)} parameters (fresh state for "
            f"them): {missing[:8]}" + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")]


class TrainingCheckpointer:
    def __init__(self, run, runtime):
        self.run, self.runtime, self.cfg = run, runtime, run.train
        self.rank = getattr(runtime, "rank", 0)
        self.world_size = getattr(runtime, "world_size", 1)
        self.is_main = getattr(runtime, "is_main", self.rank == 0)
        self.console = None      # a print for console lines (setup: the training logger's, once it exists)
        self.signals = SignalMonitor(rank=self.rank)
        self.watchdog = Watchdog(self.cfg.watchdog_timeout_factor, self.cfg.watchdog_min_seconds, self.rank,
                                 pause_seconds=self.cfg.watchdog_pause_seconds)
        if self.cfg.save and self.is_main:
            recover_replaced(self.cfg.save, self._log_error)   # before any rank looks for checkpoints:
            publish_interrupted(self.cfg.save, self._log_error)
        self.run_id = self._agree_run_id()                     # the run id's all-reduce orders it
        self.writer = None
        if self.cfg.save:
            os.makedirs(self.cfg.save, exist_ok=True)
            self.writer = CheckpointWriter(self.cfg.save, self.rank, self.world_size, self.run_id,
                                           keep=self.cfg.ckpt_keep, log=self._log_error,
                                           retain_interval=self.cfg.save_retain_interval)
        self.last_saved: int | None = None
        self.last_saved_non_persistent = False     # the save at last_saved was a non-persistent one
        self.loaded: dict | None = None
        self.save_log: list[dict] = []      # per save: iteration, blocking seconds, kind (tests, bench)
        self._reported = 0
        self.progress = (ProgressLog(self.cfg.save, self.world_size, self.is_main)
                         if getattr(self.cfg, "log_progress", False) and self.cfg.save else None)
        self._async_states: dict[int, object] = {}   # --log-progress: the train state of each async save

    # -- small collective helpers ----------------------------------------------------------------------
    def _max(self, value: float, *more: float):
        """Max over all ranks of value (and of each of `more`: one all-reduce; then a tuple)."""
        values = [float(value), *map(float, more)]
        if self.world_size > 1:
            t = torch.tensor(values, dtype=torch.float64, device=getattr(self.runtime, "device", "cpu"))
            values = self.runtime.max_over_all_ranks(t).tolist()
        return tuple(values) if more else values[0]

    def stop_signal_on_any_rank(self) -> bool:
        """Whether a stop signal has reached any rank (one all-reduce of a flag): an evaluation stops for it."""
        return self._max(1.0 if self.signals.pending else 0.0) > 0

    def agree(self, flag: bool) -> bool:
        """True when flag is True on every rank."""
        return self._max(0.0 if flag else 1.0) == 0.0

    def _agree_run_id(self) -> str:
        mine = float(random.SystemRandom().getrandbits(40)) if self.rank == 0 else 0.0
        return f"{int(self._max(mine)):010x}"

    def log(self, msg: str) -> None:
        if not self.is_main:
            return
        if self.console is not None:       # the training logger's: through its progress bar, if one is drawn
            self.console(msg)
        else:
            print(f"{timestamp()} {msg}", flush=True)

    def _log_error(self, msg: str) -> None:
        sys.stderr.write(f"{timestamp()} {msg}\n")
        sys.stderr.flush()

    # -- load ----------------------------------------------------------------------------------------
    def open_for_load(self, path: str, flag: str = "--load") -> CheckpointFolder | None:
        """The newest loadable checkpoint under PATH (given as `flag`; all ranks agree), falling back past
        missing or corrupt ones with an error naming the file; None when PATH holds no checkpoint at all."""
        candidates = checkpoint_candidates(path)
        if not candidates:
            return None
        unreadable = unreadable_latest_file(path)
        if unreadable:
            self.log(f"WARNING: {unreadable}; using the newest complete checkpoint instead")
        problems = []
        for folder_path in candidates:
            folder, problem = None, None
            try:
                # Every rank reads a share of the rank JSONs and checks a share of the tensor files (crc32).
                metadata, rank_metas = self._shared_rank_metas(folder_path)
                folder = CheckpointFolder(folder_path, metadata=metadata, rank_metas=rank_metas)
                for rf in folder.ranks[self.rank::self.world_size]:
                    rf.verify()
            except CheckpointError as err:
                problem = str(err)
                self._log_error(f"[rank {self.rank}] error: cannot load {folder_path}: {err}")
            if self.agree(problem is None):
                if problems:
                    self.log(f"WARNING: fell back to {folder_path} because newer checkpoint(s) are unusable: "
                             + "; ".join(problems))
                for rf in folder.ranks:
                    rf.verified = True      # checked by the rank that owns its share
                return folder
            problems.append(problem or f"{folder_path}: rejected by another rank (see its error)")
        raise CheckpointError(f"{flag} {path}: no loadable checkpoint; " + "; ".join(problems))

    def _shared_rank_metas(self, folder: str) -> tuple[dict, list[dict]]:
        """(metadata.json, the rank JSONs) of `folder`, each rank JSON read and checked by one rank and
        gathered (a restart at 1,024 ranks opened 1,024 x 1,024 small files); CheckpointError when any rank
        found a problem. Every rank takes part in the gather whatever it found, so none is left waiting."""
        found: dict = {}
        try:
            metadata = read_folder_metadata(folder)
            for rank in range(self.rank, metadata["layout"]["world_size"], self.world_size):
                found[rank] = read_rank_meta(folder, rank, metadata["files"])
        except (CheckpointError, OSError, ValueError, KeyError) as err:
            found = {"error": f"{err}"}
        gathered = [found]
        if self.world_size > 1:
            gathered = [None] * self.world_size
            torch.distributed.all_gather_object(gathered, found)
        if "error" in found:
            raise CheckpointError(found["error"])
        errors = [(rank, share["error"]) for rank, share in enumerate(gathered) if "error" in share]
        if errors:
            raise CheckpointError(f"{errors[0][1]} (found by rank {errors[0][0]})")
        metas = {r: meta for share in gathered for r, meta in share.items()}
        return metadata, [metas[r] for r in sorted(metas)]

    def load(self, trainer, required: bool = False) -> None:
        """Load the checkpoint --load (or --pretrained-checkpoint) holds into `trainer`. `required`: the
        model was built uninitialised for it (setup.build_model), so finding none is an error."""
        cfg = self.cfg
        if not (cfg.load or cfg.pretrained_checkpoint):
            return
        started = time.time()
        folder = None
        for path, source_cfg in start_sources(cfg):
            if source_cfg is not cfg:      # --pretrained-checkpoint (start_sources: --load's config is cfg itself)
                self.log(f"--load {cfg.load}: no checkpoint; starting from --pretrained-checkpoint {path} as a "
                         f"fine-tune (weights only, iteration 0)")
            folder = self.open_for_load(path, "--load" if source_cfg is cfg else "--pretrained-checkpoint")
            if folder is not None:
                cfg = source_cfg
                break
        if folder is None and cfg.pretrained_checkpoint:
            raise CheckpointError(no_pretrained_checkpoint_message(cfg))
        if folder is None:
            if requires_checkpoint(cfg):           # also when every candidate proved unreadable
                raise CheckpointError(missing_checkpoint_message(cfg))
            if required:
                searched = " or ".join(path for path, _cfg in start_sources(cfg))
                raise CheckpointError(f"{searched}: the checkpoint found before the model was built is gone "
                                      f"(removed meanwhile?); the model was left uninitialised for it: start again")
            resume_idiom = cfg.save and os.path.abspath(cfg.save) == os.path.abspath(cfg.load)   # a first run
            self.log(f"WARNING: --load {cfg.load}: no checkpoint found; training from scratch"
                     + ("" if resume_idiom else hub_name_hint(cfg.load, then=HUB_LOAD_STEPS)))
            return
        self.log(f"loading checkpoint {folder.folder} (iteration {folder.iteration})")
        meta = folder.metadata
        config_notes = check_model_config(meta, self.run, cfg.finetune, folder.folder)
        check_weights_only(meta, cfg, folder.folder)
        if loads_optimizer(cfg):
            require_optimizer_state(folder)
        notes = load_model(trainer.model, folder) + config_notes
        optimizer_loaded = rng_loaded = rng_everywhere = balancer_loaded = False
        if loads_optimizer(cfg):
            classes = {}
            for rf in folder.ranks:
                classes.update(rf.meta["objects"].get("optimizer", {}).get("classes", {}))
            load_optimizer(trainer.optimizer, trainer.model, folder, classes)
            optimizer_loaded = True
            notes += optimizer_state_gaps(trainer.model, folder)
            balancer_loaded = load_balancer(trainer.balancer, folder, trainer.model)
            if trainer.balancer is not None and not balancer_loaded:
                notes.append("no balancing-bias optimizer state in the checkpoint for this run's classes (the skip "
                             "class balanced by --moe-router-skip-target in one run only, or none saved): it starts "
                             "afresh")
        else:
            sync_masters_from_model(trainer.optimizer, trainer.model)
            load_saved_masters(trainer.optimizer, trainer.model, folder)   # a bf16 run's fp32 values, where saved
        rng_asked = not (cfg.no_load_rng or cfg.finetune)
        if rng_asked:
            rng_loaded = load_rng(folder, self.rank)
            rng_everywhere = self.agree(rng_loaded)      # said by the main rank, which may have its own
            if not rng_everywhere:
                notes.append(f"no RNG state in the checkpoint for every rank of this run (saved with "
                             f"{len(folder.ranks)} rank(s), this run has {self.world_size}): a rank without one "
                             f"keeps its seeded RNG")
        if cfg.finetune:
            trainer.state = type(trainer.state)()
        else:
            trainer.state = restore_train_state(type(trainer.state), meta)
        run_flags = None if meta.get("converted_from") else meta.get("args")   # a conversion records a tokenizer only
        saved_schedule = schedule_flags_of(meta)
        if cfg.use_checkpoint_opt_param_scheduler:
            if not saved_schedule:
                raise CheckpointError(f"--use-checkpoint-opt_param-scheduler: {folder.folder} holds no schedule "
                                      f"flags of a training run (converted or written by a tool): give the "
                                      f"schedule flags instead")
            notes += trainer.take_schedules_from(saved_schedule)
        elif not cfg.finetune and saved_schedule:
            changed = trainer.schedule_differences(saved_schedule)
            if changed:
                notes.append("the LR / weight-decay schedules follow this run's flags, which differ from the "
                             "checkpoint's: " + ", ".join(f"--{n.replace('_', '-')} {flag_value_text(now)} "
                                                          f"(checkpoint: {flag_value_text(then)})"
                                                          for n, then, now in changed)
                             + "; --use-checkpoint-opt_param-scheduler keeps the checkpoint's")
        if not cfg.finetune and run_flags:
            notes += batch_size_change_notes(trainer, run_flags) + seed_change_notes(trainer, run_flags)
        data_note = enter_run_data_phase(trainer.state, self.run)
        same_dir = cfg.save and os.path.abspath(os.path.dirname(folder.folder)) == os.path.abspath(cfg.save)
        if same_dir and not cfg.finetune:
            self.last_saved = trainer.state.iteration      # nothing new to save before the next step
            # a non-persistent one stays marked so: kept as persistent if the run ends here (end of training)
            self.last_saved_non_persistent = bool(meta.get("non_persistent"))
        layout = meta["layout"]
        self.loaded = {"folder": folder.folder, "iteration": folder.iteration, "optimizer": optimizer_loaded,
                       "rng": rng_loaded, "balancer": balancer_loaded, "layout": layout}
        for note in notes:
            self.log(f"WARNING: {note}")
        self.log(f"loaded checkpoint {folder.folder} (iteration {folder.iteration}, consumed samples "
                 f"{meta['train_state']['consumed_samples']}, saved with TP {layout['tensor_model_parallel_size']} "
                 f"CP {layout['context_parallel_size']} EP {layout['expert_model_parallel_size']} "
                 f"DP {layout['data_parallel_size']}{' ZeRO-1' if layout['use_distributed_optimizer'] else ''}) in "
                 f"{time.time() - started:.2f} s; optimizer {'loaded' if optimizer_loaded else 'NOT loaded'}, "
                 f"RNG {'loaded' if rng_everywhere else 'NOT loaded on every rank' if rng_asked else 'not loaded'}"
                 + ("; --finetune: iteration and samples reset to 0" if cfg.finetune else ""))
        if data_note:
            self.log(data_note)

    # -- save -----------------------------------------------------------------------------------------
    def _global_meta(self, trainer) -> dict:
        run, state = self.run, trainer.state
        p = run.parallel
        tp, cp, ep = p.tensor_model_parallel_size, p.context_parallel_size, p.expert_model_parallel_size
        return {
            "train_state": dataclasses.asdict(state),
            "consumed_samples": state.consumed_samples,
            "tokens_seen": state.consumed_tokens,
            "model_config": run.model.to_dict(),
            "optimizer_config": _jsonable(dataclasses.asdict(run.optim)),
            "args": _jsonable(vars(run.args)) if getattr(run, "args", None) is not None else {},
            # the flags the schedules were built from: this run's, or a checkpoint's under
            # --use-checkpoint-opt_param-scheduler (whose next resume must find that schedule, not these flags)
            "schedule_flags": _jsonable(getattr(trainer, "schedule_flags", {})),
            "working_directory": os.getcwd(),     # where the relative paths in "args" start
            "layout": {"world_size": self.world_size, "tensor_model_parallel_size": tp, "context_parallel_size": cp,
                       "expert_model_parallel_size": ep, "data_parallel_size": self.world_size // (tp * cp),
                       "use_distributed_optimizer": bool(p.use_distributed_optimizer),
                       "sequence_parallel": bool(p.sequence_parallel)},
            "torch_version": torch.__version__,
        }

    def collect(self, trainer) -> tuple[list, dict]:
        entries = model_entries(trainer.model)
        opt_entries, opt_objects, bal_entries, bal_objects = [], {}, [], {}
        if not self.cfg.no_save_optim:     # --no-save-optim: weights only (a resume then needs --no-load-optim)
            opt_entries, opt_objects = optimizer_entries(trainer.optimizer, trainer.model)
            bal_entries, bal_objects = balancer_entries(getattr(trainer, "balancer", None), self.rank)
        rng_entries, rng_objects = rng_entries_and_objects() if not self.cfg.no_save_rng else ([], {})
        objects = {"optimizer": opt_objects, "rng": rng_objects, "balancer": bal_objects,
                   "train_state": dataclasses.asdict(trainer.state)}
        return entries + opt_entries + rng_entries + bal_entries, objects

    def save(self, trainer, reason: str = "interval", non_persistent: bool = False) -> bool | None:
        """Save at trainer.state.iteration (`non_persistent`: to be removed once a newer checkpoint is
        complete). Returns True/False for a synchronous save, None when an asynchronous one was started."""
        if self.writer is None:
            return False
        iteration = trainer.state.iteration
        if self.last_saved == iteration:
            if non_persistent or not self.last_saved_non_persistent:
                return True    # saved at this iteration already, and kept at least as long as asked
            if self._promote(iteration, reason):
                return True
            # that non-persistent save failed: saved again below, as a persistent one
        self.log(f"saving checkpoint at iteration {iteration} ({reason}) to {self.writer.final_dir(iteration)}")
        started = time.time()
        with self.watchdog.paused():
            entries, objects = self.collect(trainer)
            meta = dict(self._global_meta(trainer), non_persistent=non_persistent)
            if self.cfg.async_save:
                self.writer.save_async(iteration, entries, objects, meta, self.agree)
                ok = None
            else:
                ok = self.writer.save_sync(iteration, entries, objects, meta, self.agree)
        blocked = time.time() - started
        self.last_saved, self.last_saved_non_persistent = iteration, non_persistent
        if ok is not None:
            self._reported = len(self.writer.completed)
        self.save_log.append({"iteration": iteration, "blocking_s": blocked, "async": bool(self.cfg.async_save),
                              "reason": reason})
        if ok is None:
            self.log(f"checkpoint iteration {iteration} ({reason}): state copied in {blocked:.3f} s, writing to "
                     f"{self.writer.partial_dir(iteration)} in the background")
            if self.progress is not None:
                self._async_states[iteration] = copy.copy(trainer.state)
                self.progress.write(f"Started async checkpoint\tIteration: {iteration}")
        elif ok:
            self.log(f"saved checkpoint {self.writer.final_dir(iteration)} ({reason}) in {blocked:.2f} s")
            if self.progress is not None:
                self.progress.checkpoint_saved(trainer.state)
        else:
            self.log(f"ERROR: checkpoint at iteration {iteration} FAILED ({reason}); the previous checkpoint "
                     f"{self._latest_complete()} stays the latest")
        return ok

    def _promote(self, iteration: int, reason: str) -> bool:
        """Keep the non-persistent checkpoint of `iteration` (this run's last save) as a persistent one,
        once it is complete (an asynchronous one is waited for); False when that save failed."""
        with self.watchdog.paused():
            self.writer.wait(agree=self.agree)
        self._report_async()
        if self._last_save_failed():
            return False
        self.last_saved_non_persistent = False
        if self.is_main:
            self.writer.promote(iteration)
            self.log(f"kept the non-persistent checkpoint {self.writer.final_dir(iteration)} as a persistent one "
                     f"({reason})")
            self.writer.prune(iteration)       # one more persistent checkpoint: --ckpt-keep applies
        return True

    def _latest_complete(self) -> str:
        done = list_complete(self.cfg.save) if self.cfg.save else []
        return os.path.join(self.cfg.save, iter_dir_name(done[-1])) if done else "(none)"

    def _report_async(self) -> None:
        if self.writer is None:
            return
        for iteration, ok in self.writer.completed[self._reported:]:
            if ok:
                self.log(f"checkpoint {self.writer.final_dir(iteration)} complete")
                state = self._async_states.pop(iteration, None)
                if self.progress is not None and state is not None:
                    self.progress.checkpoint_saved(state)
            else:
                self.log(f"ERROR: asynchronous checkpoint iteration {iteration} FAILED; the latest complete one is "
                         f"{self._latest_complete()}")
        self._reported = len(self.writer.completed)

    def _last_save_failed(self) -> bool:
        return bool(self.writer and self.writer.completed and not self.writer.completed[-1][1])

    # -- hooks ------------------------------------------------------------------------------------------
    def before_training(self, trainer) -> None:
        if self.writer is not None:      # --save-retain-interval never removes what came before this run's start
            self.writer.retain_from = trainer.state.iteration
        if self.progress is not None:
            self.progress.job_started(trainer.state)

    def after_step(self, trainer, trained: bool = True) -> None:
        self.watchdog.beat(trained)
        writing = self.writer is not None and self.writer.in_flight
        code, writing = self._max(self._signal_code(), writing)
        waited = self.writer is not None and self.writer._thread is not None and not writing
        if waited:
            self.writer.wait(agree=self.agree)      # done on every rank: all agree on the outcome
        self._report_async()
        if not code:
            interval, non_persistent = self.cfg.save_interval, self.cfg.non_persistent_save_interval
            if interval and trainer.state.iteration % interval == 0:
                self.save(trainer)
            elif non_persistent and trainer.state.iteration % non_persistent == 0:
                self.save(trainer, reason="non-persistent", non_persistent=True)
            elif not waited:
                return
            # A signal that came during that save (or wait) stops the run now: the checkpoint of this iteration
            # is there (made persistent below if it was not), and another step and save could overrun the
            # grace period before the time limit's SIGKILL.
            code = self._max(self._signal_code())
            if not code:
                return
        name = {v: k for k, v in SIGNAL_CODES.items()}.get(int(code), "signal")
        if self.writer is not None:
            self.save(trainer, reason=f"{name} received")
        trainer.stop_requested = f"{name} received"

    def _signal_code(self) -> float:
        return SIGNAL_CODES.get(self.signals.received, 4) if self.signals.pending else 0

    def on_exit(self, trainer) -> None:
        if self.writer is not None:      # (a save at this iteration already: kept, made persistent if it was not)
            self.save(trainer, reason="exit")

    def finalize(self, trainer) -> None:
        if self.writer is not None:
            self.save(trainer, reason="end of training")     # (see on_exit)
            if self.writer.in_flight or self.writer._thread is not None:
                self.log("waiting for the checkpoint being written in the background")
            with self.watchdog.paused():
                self.writer.wait(agree=self.agree)
            self._report_async()
            if self._last_save_failed():
                raise CheckpointError(f"the final checkpoint (iteration {self.writer.completed[-1][0]}) could not be "
                                      f"written; the latest complete checkpoint is {self._latest_complete()}")
        self.close()

    def close(self) -> None:
        """Idempotent: wait for a save in flight (its state is complete and worth keeping), stop the
        watchdog, restore the signal handlers."""
        if self.writer is not None and self.writer._thread is not None:
            if self.writer.in_flight:
                self.log("waiting for the background checkpoint save to finish (Ctrl-C again abandons it)")
            self.writer.wait(timeout=float(os.environ.get("MEGATRON_ZAYA_CKPT_CLOSE_TIMEOUT", "300")))
            self._report_async()
        self.watchdog.stop()
        self.signals.restore()


def restore_train_state(state_type, meta: dict):
    """The saved train state as `state_type`; fields it lacks keep their defaults, except
    `consumed_tokens` of a checkpoint saved before tokens were counted per step: consumed samples
    times the checkpoint's own sequence length (exact unless that run changed --seq-length), and
    the schedules' position of one saved before the schedules skipped failed steps: its consumed
    samples and its iteration (what the schedule was then a function of)."""
    saved = dict(meta["train_state"])
    saved.setdefault("scheduled_samples", saved["consumed_samples"])
    saved.setdefault("scheduled_iterations", float(saved["iteration"]))
    if "consumed_tokens" not in saved:
        saved["consumed_tokens"] = saved["consumed_samples"] * meta["model_config"]["seq_length"]
    return state_type(**{f.name: saved[f.name] for f in dataclasses.fields(state_type) if f.name in saved})


def seed_change_notes(trainer, saved_flags: dict) -> list[str]:
    """A resume with another --seed: the data goes on at the run's sample count in the new seed's shuffle, so the
    rest of the epoch is another permutation (as in Megatron-LM, which says nothing)."""
    then, now = saved_flags.get("seed"), trainer.cfg.seed
    if then is None or then == now:
        return []
    return [f"--seed {now} (checkpoint: {then}): the data goes on from sample {trainer.state.consumed_samples} of "
            f"this seed's shuffle, not the checkpoint's: the rest of the epoch may repeat samples already trained "
            f"on and leave out others (the RNG state still comes from the checkpoint)"]


def batch_size_change_notes(trainer, saved_flags: dict) -> list[str]:
    """A resume under --train-iters with another --global-batch-size: the schedules go on at the run's
    iteration, each new step one iteration (ZAYA1's 32K phase), where Megatron-LM counts its schedule in
    samples and would stand at samples / new batch size. Said once, as the other schedule notes."""
    then, now = saved_flags.get("global_batch_size"), trainer.cfg.global_batch_size
    if trainer.lr_schedule.unit != "iters" or then is None or then == now:
        return []
    state = trainer.state
    return [f"--global-batch-size {now} (checkpoint: {then}): the LR / weight-decay schedules go on from "
            f"iteration {state.scheduled_iterations:g} of --train-iters, one per step of {now} samples; "
            f"Megatron-LM counts them in samples and would go on from {state.scheduled_samples / now:g} "
            f"(--train-samples with the --lr-*-samples flags counts samples here too)"]
