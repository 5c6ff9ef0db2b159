"""The training loop: one process = one rank, from `run.yaml` to an exit code.

Per step: rampup batch -> LR -> `engine.train_batch` -> metrics -> heartbeat progress -> agreed
control decision (kill / time budget / time-based checkpoint) -> step-interval checkpoint -> maybe
stop. The loop's state (`TrainState`) is five counters and the rollback bookkeeping
(`RollbackState`: the data skip list, the LR cut, the directives applied; orchestrator/contract/client/rollback.py);
with the engine's files and each rank's RNG state they are the whole checkpoint, which is what
makes a resume bit-exact.

At start, the checkpoint to resume from is the newest verified one, or the one an accepted rollback
directive asks for (trainer/resume.py); after its load the model must compute on the probe batch
what it computed when it was saved (trainer/probe.py), else it is reported damaged and the one
before is loaded.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from orchestrator.contract import CHECKPOINT_STATE_NAME, ExitCode, Phase, RunPaths
from orchestrator.contract.client import rollback as rb
from orchestrator.contract.client.beat import HeartbeatWriter
from orchestrator.contract.client.progress import waiting
from orchestrator.contract.client.stop import Agreement, Controls, adaptive_interval_bounds
from trainer import checkpoint as ckpt
from trainer import engine as eng
from trainer import probe
from trainer import resume as rs
from trainer.compute_time import ComputeClock
from trainer.faults import Fault, FaultInjector, parse_faults
from trainer.launch import DistEnv
from trainer.metrics import MetricsLogger
from trainer.schedules import lr_schedule_from_config, rampup_from_config
from trainer.start_phases import PHASES


@dataclass
class TrainState:
    step: int = 0  # optimizer steps taken (skipped ones included): checkpoint step_N = after N steps
    # The data position in the global sample order: one past the last sample served, the samples
    # a rollback skipped included (docs/data.md, "Exact data skip"). Drives the rampup.
    consumed_samples: int = 0
    lr_samples: int = 0  # samples of applied steps; drives the LR (a skipped step does not advance it)
    skipped_total: int = 0
    global_batch: int = 0  # the rampup state at the last step (checked against the schedule on resume)

    @classmethod
    def from_dict(cls, data: dict) -> TrainState:
        return cls(**{k: int(data[k]) for k in cls.__dataclass_fields__ if k in data})


@dataclass
class Overrides:
    """Environment overrides (documented in trainer/__main__.py)."""

    max_steps: int | None = None
    stop_after_steps: int | None = None
    job_start_time: float | None = None
    step_delay_seconds: float = 0.0
    faults: list[Fault] = field(default_factory=list)  # TEST-ONLY (trainer.faults)
    tensorboard: bool = True
    sample_log: bool = False  # logs/samples-dp<d>.jsonl: the positions each step read (tests, audits)

    @classmethod
    def from_env(cls, env) -> Overrides:
        def opt_int(name):
            return int(env[name]) if env.get(name) else None

        return cls(
            max_steps=opt_int("TRAINER_MAX_STEPS"),
            stop_after_steps=opt_int("TRAINER_STOP_AFTER_STEPS"),
            job_start_time=float(env["TRAINER_JOB_START_TIME"]) if env.get("TRAINER_JOB_START_TIME") else None,
            step_delay_seconds=float(env.get("TRAINER_STEP_DELAY_SECONDS") or 0.0),
            faults=parse_faults(env.get("TRAINER_FAULT", "")),
            tensorboard=env.get("TRAINER_TENSORBOARD", "1") != "0",
            sample_log=env.get("TRAINER_SAMPLE_LOG", "0") == "1",
        )


def log(rank: int, message: str) -> None:
    if rank == 0:
        print(f"[trainer] {message}", flush=True)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# -- data --------------------------------------------------------------------------------------
def eval_samples(cfg) -> int:
    """The validation set: a FIXED set of eval_iters full global batches, evaluated every
    eval_interval steps, so that eval losses at different steps are comparable."""
    return cfg.data.eval_iters * cfg.parallel.global_batch_size


def build_split(cfg, paths: RunPaths, on_this_rank: bool):
    """(train, valid, test) over data_cache/; `on_this_rank` False: map the cached indices only
    (IndexCacheMissing when they are not there)."""
    from trainer.data import build_train_valid_test_datasets

    return build_train_valid_test_datasets(
        [d.path for d in cfg.data.datasets], [d.weight for d in cfg.data.datasets], cfg.data.split,
        (cfg.train_samples, eval_samples(cfg), 0), cfg.model.seq_length, cfg.data.seed, paths.data_cache,
        on_this_rank,
    )[:2]


def build_datasets(cfg, paths: RunPaths, rank: int, mapped: tuple | None = None):
    """(train, valid or None): Megatron's indexed dataset + cached sample indices (rank 0 builds the
    cache in data_cache/, the others wait, then memory-map it). `mapped`: this rank's indices,
    mapped already by the warm standby (trainer/prepared_start.py); the barrier is kept, so that
    ranks with and without them agree."""
    import torch.distributed as tdist

    from orchestrator.plan.preflight import data_checks
    from trainer.parallel.groups import LayoutError

    # Every rank checks before the barrier (python -m trainer checked at start too; this is for
    # the other callers): a missing dataset is a config problem (exit CONFIG_ERROR, the controller
    # does not restart), not a crash of rank 0 alone. The rule is the submit host's pre-flight.
    missing = [check.message for check in data_checks(cfg) if check.level == "error"]
    if missing:
        raise LayoutError("; ".join(missing))

    datasets = mapped if mapped is not None else build_split(cfg, paths, True) if rank == 0 else None
    if tdist.is_initialized() and tdist.get_world_size() > 1:
        tdist.barrier()
    if datasets is None:
        datasets = build_split(cfg, paths, False)
    train, valid = datasets
    if train is None:
        raise RuntimeError(f"data.split={cfg.data.split!r} leaves no training documents: give the train split a share")
    return train, valid


def pipe_batches(loader):
    """{"text": [mbs, seq+1]} -> (input_ids [mbs, seq], labels [mbs, seq]) as PipelineEngine wants."""
    for batch in loader:
        text = batch["text"]
        yield text[:, :-1].contiguous(), text[:, 1:].contiguous()


# -- the loop ----------------------------------------------------------------------------------
class Trainer:
    def __init__(self, cfg, paths: RunPaths, dist: DistEnv, overrides: Overrides, heartbeat: HeartbeatWriter):
        self.cfg, self.paths, self.dist, self.ov, self.hb = cfg, paths, dist, overrides, heartbeat
        self.rank = dist.rank
        self.lr_schedule = lr_schedule_from_config(cfg)
        self.rampup = rampup_from_config(cfg)
        self.state = TrainState()
        self.rollback = rb.RollbackState()
        self.pinned: Path | None = None  # load exactly this checkpoint (a replay), no fallback, nothing reported
        self.probe_problems: list[str] = []
        self.faults = FaultInjector(overrides.faults, self.rank)  # TEST-ONLY; inert without TRAINER_FAULT
        self.prepared = None  # what the warm standby built before the go (trainer/prepared_start.py)

    def build(self) -> None:
        from trainer.model import build_pipeline_module, universal_checkpoint_info
        from trainer.parallel.groups import ParallelLayout, initialize_model_parallel
        from trainer.progress_io import install_counting_checkpoint_engine  # imports deepspeed

        cfg = self.cfg
        self.layout = ParallelLayout.from_config(cfg, world_size=self.dist.world_size)
        initialize_model_parallel(self.layout)
        seed_everything(cfg.seed)
        prebuilt = self.prepared.units_for(self.layout, self.rank) if self.prepared is not None else {}
        module = build_pipeline_module(cfg, self.layout, prebuilt=prebuilt)
        if prebuilt:
            log(self.rank, f"model: {len(prebuilt)} units built by the warm standby")
        module.loss_fn = self.faults.wrap_loss(module, module.loss_fn)
        PHASES.mark("model")
        # Chosen before the engine exists: a checkpoint of another layout loads as a universal one,
        # which DeepSpeed must know at initialisation.
        self.layout_dict = {"tp": self.layout.tp, "pp": self.layout.pp, "dp": self.layout.dp}
        if self.pinned is None:
            self.directive = rs.read_directive(self.paths)
            self.candidates = rs.candidates(self.paths, self.layout_dict, self.dist.job_id, self.directive,
                                            lambda message: log(self.rank, message))
        else:  # a replay (trainer/replay.py): that checkpoint, as it is, whatever accepted/ says
            self.directive = None
            self.candidates = rs.pinned(self.paths, self.pinned, self.layout_dict)
        # A relaunch inside the job restores from node-local and peer copies when some node holds
        # one (trainer/restore_order.py): then nothing of the shared checkpoint is read, not even
        # to verify it; the shared candidates stay the fallback.
        self.local_step = None
        if self.pinned is None and self.directive is None and cfg.checkpoint.local_dir is not None:
            from trainer import restore_order

            self.local_step = restore_order.newest_local_step(cfg, self.paths.root, self.dist.job_id,
                                                              self.layout_dict, self.paths.checkpoints)
            PHASES.mark("local_copies_found")
        self.candidate = next(self.candidates, None) if self.local_step is None else None
        self.universal = self.candidate is not None and self.candidate.universal
        self.engine = eng.initialize(cfg, module, self.rampup.micro_batches_at(0), load_universal=self.universal)
        eng.install_replicated_grad_sync(self.engine, self.layout.tp)
        # Fine progress for the heartbeat (orchestrator/contract/client/progress.py): micro-batches, reduce, optimizer,
        # checkpoint bytes. The faults' hooks go in too (TEST-ONLY, inert without TRAINER_FAULT).
        eng.install_progress_marks(self.engine)
        eng.install_collective_waits()
        install_counting_checkpoint_engine(self.engine, after_chunk=self.faults.save_chunk_hook())
        self.faults.wrap_engine(self.engine)
        groups = self.engine.optimizer.param_groups
        log(self.rank, f"engine {type(self.engine).__name__}, optimizer {type(self.engine.optimizer).__name__}, "
                       f"{len(groups)} param groups {[g.get('name') for g in groups]}, layout tp={self.layout.tp} "
                       f"pp={self.layout.pp} dp={self.layout.dp}")
        self.uc_info = universal_checkpoint_info(cfg, self.layout)
        PHASES.mark("engine")
        self.async_writer = None
        if cfg.checkpoint.async_save:  # every rank, same point: it creates the writers' process group
            from trainer.async_checkpoint import AsyncCheckpointer
            from trainer.local_save import LocalCopies

            self.async_writer = AsyncCheckpointer(self.faults, lambda group: LocalCopies.start(
                cfg, self.paths.root, self.dist.job_id, group))
        PHASES.mark("checkpoint_writer")
        self.dp_rank = self.engine.grid.get_data_parallel_id()
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() and \
            os.environ.get("DS_ACCELERATOR") != "cpu" else None
        mapped = self.prepared.datasets if self.prepared is not None else None
        self.dataset, self.valid_dataset = build_datasets(cfg, self.paths, self.rank, mapped)
        self.prepared = None  # what was not used goes now
        self.probe_name, self.probe_dataset = probe.probe_dataset(self.dataset, self.valid_dataset)
        PHASES.mark("data_index")
        self.local_restore = None
        if self.local_step is not None:
            self.choose_local_restore()
            PHASES.mark("copies_fetched_checked")
        if self.valid_dataset is None and cfg.data.eval_iters:
            log(self.rank, f"no validation documents in split {cfg.data.split!r}: evaluation is off")

    def choose_local_restore(self) -> None:
        """The local candidate (collective), or the shared ones when the copies cannot be used."""
        from orchestrator.contract.directive import read_checkpoint_state
        from trainer import restore_order

        group = self.async_writer.group if self.async_writer is not None else None
        restore = restore_order.prepare(self.cfg, self.paths.root, self.paths.checkpoint(self.local_step),
                                        self.dist.job_id, self.engine, self.local_step, group)
        if restore is None:
            self.candidate = next(self.candidates, None)
            return
        self.local_restore = restore
        state = rs.on_rank0(lambda: read_checkpoint_state(restore.folder))
        self.candidate = rs.Candidate(restore.folder, restore.folder, False, restore.step, state, ())
        for rel, source, size, path in restore.log.reads:
            print(f"[restore rank {self.rank}] read {rel} from {source} ({size} bytes): {path}", flush=True)
        log(self.rank, f"restoring step {restore.step} from the nearest copies: bytes read "
                       f"{restore.bytes} (every rank){'; dropped: ' + '; '.join(restore.dropped) if restore.dropped else ''}")

    def resume(self) -> None:
        """Load the first candidate whose probe matches (collective); see trainer/resume.py."""
        loaded_damaged = False
        candidate = self.candidate
        dropped = list(self.local_restore.dropped) if self.local_restore is not None else []
        while candidate is not None:
            if candidate.universal != self.universal:
                raise RuntimeError(f"{candidate.found.name} needs an engine built {'with' if candidate.universal else 'without'} "
                                   "universal loading; the next start will choose it (the damaged ones are reported)")
            loading = time.time()
            if self.local_restore is not None:
                from trainer import restore_order

                with restore_order.WatchReads(self.engine, self.local_restore, self.local_restore.store_base):
                    client = ckpt.load_checkpoint(self.engine, self.paths, candidate.loadable)
                self.local_restore.bytes = restore_order.total_bytes(self.local_restore.log)
                for rel, _, size, path in self.local_restore.log.reads:
                    if path.endswith("(unplanned)"):
                        print(f"[restore rank {self.rank}] read {rel} from shared ({size} bytes): {path}", flush=True)
            else:
                client = ckpt.load_checkpoint(self.engine, self.paths, candidate.loadable)
            problems = []
            if self.cfg.checkpoint.verify_probe:
                done, problems = rs.check_probe(self.engine, self.cfg, self.layout, self.probe_name, self.probe_dataset,
                                                candidate.found)
                log(self.rank, done)
            self.probe_problems = problems
            PHASES.mark("load_and_probe")
            if not problems or self.pinned is not None:
                break
            if self.local_restore is not None:  # dropped as a whole: the shared copies are next
                dropped.append(f"the local and peer copies of step {self.local_restore.step}: probe mismatch "
                               f"({'; '.join(problems[:2])}); dropped, the shared checkpoint is used")
                log(self.rank, dropped[-1])
                self.local_restore = None
                candidate = next(self.candidates, None)
                continue
            if self.rank == 0:
                ckpt.report_damaged(self.paths, candidate.found, problems, self.dist.job_id,
                                    manifest_sha256=ckpt.manifest_digest(candidate.found))
            loaded_damaged = True
            candidate = next(self.candidates, None)
        if candidate is None:
            self.start_fresh(loaded_damaged)
            return
        self.state = TrainState.from_dict(client)
        self.rollback = rb.resume_state(candidate.state, self.directive, candidate.step, self.state.consumed_samples,
                                        candidate.passed)
        # For the controller: goodput accounting, and the step this job really resumed from.
        self.hb.note(checkpoint_load_seconds=time.time() - loading, resumed_from=self.state.step,
                     start_phases=dict(PHASES.seconds), dropped_copies=dropped[:64],
                     restore_bytes=dict(self.local_restore.bytes) if self.local_restore is not None else {})
        if self.directive is not None and not rb.has_applied(candidate.state, self.directive):
            self.hb.note(rollback_applied=self.directive.id)
            log(self.rank, rb.describe(self.directive, candidate.step, self.rollback))
        skips = self.rollback.skips
        last_start = skips.position_of(max(0, skips.kept_below(self.state.consumed_samples) - self.state.global_batch))
        expected = self.rampup.global_batch_at(last_start)
        if self.state.global_batch and expected != self.state.global_batch:
            log(self.rank, f"WARNING: the rampup config changed: the checkpoint's last batch was "
                           f"{self.state.global_batch}, the schedule now says {expected}")
        log(self.rank, f"resumed from {candidate.loadable.name}: step {self.state.step}, "
                       f"consumed {self.state.consumed_samples}")

    def start_fresh(self, loaded_damaged: bool) -> None:
        from trainer.parallel.groups import LayoutError

        if loaded_damaged:  # the engine holds a damaged state: the next start skips it and begins cleanly
            raise RuntimeError("every checkpoint left failed its probe (reported in checkpoints/damaged.jsonl); "
                               "the next start begins from step 0")
        if self.directive is not None and self.directive.to_step > 0:
            raise LayoutError(f"accepted/rollback {self.directive.id} asks for a checkpoint at or before step "
                              f"{self.directive.to_step} and none verifies: give to_step 0 to restart from the "
                              "initial weights, or withdraw the directive")
        if self.directive is not None:
            self.rollback = rb.resume_state(None, self.directive, 0, 0)
            log(self.rank, rb.describe(self.directive, 0, self.rollback))
        log(self.rank, "no checkpoint to resume from: starting at step 0")

    def save(self, why: str) -> None:
        from deepspeed.checkpoint.constants import UNIVERSAL_CHECKPOINT_INFO

        st = self.state
        self.hb.set_phase(Phase.CHECKPOINT, st.step)
        started = time.time()
        since = started - self.controls.last_checkpoint_time  # the interval this save closes
        client = {**asdict(st), "lr_schedule": asdict(self.lr_schedule), "rampup": asdict(self.rampup),
                  "why": why}
        state = self.rollback.checkpoint_state(st.step, st.consumed_samples, st.lr_samples, st.skipped_total,
                                               st.global_batch)
        json_files = {CHECKPOINT_STATE_NAME: state.to_dict()}
        if self.cfg.checkpoint.verify_probe:  # what the model being saved computes, before it is written
            computed = probe.compute_probe(self.engine, self.cfg, self.layout, self.probe_name, self.probe_dataset)
            json_files[probe.PROBE_NAME] = probe.probe_file_record(computed)
            log(self.rank, f"probe of step {st.step}: loss {computed['loss']:.6g} in {computed['seconds']:.3f}s")
            if len(set(computed["replica_logits_sha256"])) > 1:
                log(self.rank, f"WARNING: probe of step {st.step}: the DP replicas compute different logits from "
                               "the same weights (silent data corruption?): run `python -m trainer.replay`")
        save = self.async_writer.save if self.async_writer is not None else ckpt.save_checkpoint
        path = save(self.engine, self.paths, st.step, client, self.cfg.checkpoint.keep_last,
                    self.dist.job_id, extra_client_state={UNIVERSAL_CHECKPOINT_INFO: self.uc_info},
                    layout=self.layout_dict, json_files=json_files,
                    before_write=lambda: self.faults.before_checkpoint_write(self.engine, st.step))
        self.controls.checkpoint_saved()
        done = "snapshot of" if self.async_writer is not None else "saved"
        log(self.rank, f"{done} {path.name} ({why}) in {time.time() - started:.3f}s, {since:.2f} s after the last "
                       "save (or the start)")
        self.hb.set_phase(Phase.STEP, self.state.step)

    def wait_for_checkpoint_write(self) -> None:
        """Before any clean exit: an async write in flight is finished and sealed (or failed)."""
        if self.async_writer is not None and self.async_writer.in_flight:
            self.hb.set_phase(Phase.CHECKPOINT, self.state.step)
            log(self.rank, f"waiting for the background write of {self.async_writer.in_flight} before exiting")
            self.async_writer.wait()

    def evaluate(self) -> float | None:
        """Mean loss over the fixed validation batches (collective), in the EVAL phase."""
        if self.valid_dataset is None or not self.cfg.data.eval_iters:
            return None
        from trainer.data import build_data_loader

        cfg = self.cfg
        self.hb.set_phase(Phase.EVAL, self.state.step)
        loader = build_data_loader(self.valid_dataset, 0, cfg.parallel.micro_batch_size, self.dp_rank, cfg.dp)
        batches = pipe_batches(loader)
        micro_batches = cfg.parallel.global_batch_size // (cfg.parallel.micro_batch_size * cfg.dp)
        losses = [float(self.engine.eval_batch(batches, num_micro_batches=micro_batches))
                  for _ in range(cfg.data.eval_iters)]
        self.hb.set_phase(Phase.STEP, self.state.step)
        return sum(losses) / len(losses)

    # -- one step ------------------------------------------------------------------------------
    def start_data(self) -> None:
        """This rank's micro-batches from the data position on, the skipped ranges left out."""
        from trainer.data import build_data_loader
        from trainer.data.sample_log import SampleLog

        cfg = self.cfg
        tp_rank, dp_rank, pp_rank = self.layout.coords_of(self.rank)
        logged = self.ov.sample_log and tp_rank == 0 and pp_rank == 0
        self.sample_log = SampleLog(self.paths.sample_log(dp_rank) if logged else None)
        dataset = self.sample_log.wrap(self.faults.wrap_dataset(self.dataset))
        loader = build_data_loader(dataset, self.state.consumed_samples, cfg.parallel.micro_batch_size, self.dp_rank,
                                   cfg.dp, skips=self.rollback.skips)
        self.batches = pipe_batches(loader)

    def next_global_batch(self) -> int | None:
        """The rampup's batch at the data position of the next batch's first sample; None when the
        training samples left (skipped ones not counted) cannot fill it."""
        skips, consumed = self.rollback.skips, self.state.consumed_samples
        global_batch = self.rampup.global_batch_at(skips.position_of(skips.kept_below(consumed)))
        return None if skips.kept_between(consumed, self.cfg.train_samples) < global_batch else global_batch

    def train_step(self, global_batch: int, clock: ComputeClock | None = None) -> dict:
        """One optimizer step (collective); the counters advance; returns its metrics (not logged)."""
        st = self.state
        eng.set_global_batch(self.engine, global_batch)
        lr = self.lr_schedule.lr_at(st.lr_samples) * self.rollback.lr_factor(st.step + 1)
        eng.set_lr(self.engine, lr)
        if clock is not None:
            clock.start()
        self.faults.before_step(st.step + 1)  # a `slow` fault's busy work counts as this rank's compute
        if self.ov.step_delay_seconds:
            time.sleep(self.ov.step_delay_seconds)
        skipped_before = self.engine.skipped_steps
        started = time.time()
        loss = float(self.engine.train_batch(self.batches))
        seconds = time.time() - started
        compute_seconds = clock.stop() if clock is not None else None
        skipped = eng.step_was_skipped(self.engine, skipped_before)
        st.step += 1
        st.consumed_samples = self.rollback.skips.advance(st.consumed_samples, global_batch)
        st.global_batch = global_batch
        if skipped:
            st.skipped_total += 1
        else:
            st.lr_samples += global_batch
        self.sample_log.step_done(st.step)
        return {"step": st.step, "loss": loss, "lr": lr, "grad_norm": eng.grad_norm(self.engine), "skipped": skipped,
                "skipped_total": st.skipped_total, "global_batch": global_batch,
                "consumed_samples": st.consumed_samples, "step_seconds": seconds, "dp_losses": self.dp_losses(),
                "compute_seconds": compute_seconds}

    def dp_losses(self) -> list[float] | None:
        """Each DP replica's own loss of the last step (collective; None at dp = 1): what lets a
        replay name the replica that computed differently (trainer/replay.py)."""
        import torch.distributed as tdist

        if self.layout.dp == 1:
            return None
        mine = float(self.engine.dp_group_loss) if self.engine.is_last_stage() else float("nan")
        values = [torch.zeros(1, dtype=torch.float64, device=self.device) for _ in range(self.dist.world_size)]
        tdist.all_gather(values, torch.tensor([mine], dtype=torch.float64, device=self.device))
        last = self.layout.pp - 1
        return [float(values[self.layout.rank_of(0, d, last)].item()) for d in range(self.layout.dp)]

    # -- the loop ---------------------------------------------------------------------------------
    def train(self) -> ExitCode:
        cfg, st = self.cfg, self.state
        self.metrics = MetricsLogger(cfg, self.paths, self.rank, self.dist.world_size, self.ov.tensorboard)
        self.controls = Controls(
            self.paths, self.rank, self.ov.job_start_time or time.time(), cfg.checkpoint.exit_duration_minutes,
            cfg.checkpoint.interval_hours, cfg.cluster.pre_timeout_signal, device=self.device,
            interval_bounds=adaptive_interval_bounds(cfg.checkpoint),
        )
        self.start_data()
        # Straggler detection: this rank's compute time per step, waits for peers excluded (compute_time.py);
        # ranks of the same pipeline stage and TP rank do the same work: the controller compares them.
        compute_clock = ComputeClock(self.engine, cuda=self.device is not None)
        tp_rank, _, pp_rank = self.layout.coords_of(self.rank)
        compute_group = f"pp{pp_rank}.tp{tp_rank}"
        steps_this_run = 0
        last_saved_step = st.step
        self.hb.set_phase(Phase.STEP, st.step)
        if self.controls.agree().kill:  # a kill switch left in place: nothing to train, nothing to save
            log(self.rank, f"not training: {self.controls.describe_stop(Agreement(kill=True))}; remove control/kill "
                           "(runctl resume) to continue")
            return ExitCode.KILLED
        while True:
            global_batch = self.next_global_batch()
            if global_batch is None or (self.ov.max_steps is not None and st.step >= self.ov.max_steps):
                break
            step = self.train_step(global_batch, compute_clock)
            steps_this_run += 1
            eval_loss = self.evaluate() if st.step % cfg.data.eval_interval == 0 else None
            compute_seconds = step.pop("compute_seconds")
            record = self.metrics.log_step(**step, eval_loss=eval_loss)
            if step["skipped"]:
                log(self.rank, f"step {st.step}: non-finite gradient norm, step SKIPPED (total {st.skipped_total})")
            self.hb.progress(st.step, loss=record.loss, consumed_samples=st.consumed_samples,
                             compute_seconds=compute_seconds, compute_step=st.step, compute_group=compute_group)

            with waiting():  # every rank's flags: the time here is the slowest peer's
                decision: Agreement = self.controls.agree()
            interval = cfg.checkpoint.interval_steps
            stop_after = self.ov.stop_after_steps is not None and steps_this_run >= self.ov.stop_after_steps
            if decision.stop or stop_after or decision.checkpoint_due or (interval and st.step % interval == 0):
                why = ("kill" if decision.kill else "time budget" if decision.time_budget or stop_after
                       else "time interval" if decision.checkpoint_due else "step interval")
                self.save(why)
                last_saved_step = st.step
            if decision.stop or stop_after:
                why = self.controls.describe_stop(decision) if decision.stop else "TRAINER_STOP_AFTER_STEPS"
                print(f"[trainer rank {self.rank}] stopping at step {st.step}: {why}", flush=True)
                self.wait_for_checkpoint_write()
                return ExitCode.KILLED if decision.kill else ExitCode.TIME_BUDGET
        if st.step != last_saved_step:
            self.save("finished")
        self.wait_for_checkpoint_write()
        log(self.rank, f"finished: {st.step} steps, {st.consumed_samples} samples, {st.skipped_total} skipped")
        return ExitCode.FINISHED

    def close(self) -> None:
        metrics = getattr(self, "metrics", None)
        if metrics is not None:
            metrics.close()
