"""Auxiliary jobs through submitit (`runctl preprocess | convert | export-hf | eval`), end to end.

- On the real local SLURM cluster: `runctl preprocess` submits a job with submitit on the run's
  partition and account (SLURM's own `scontrol show job` says so); the indexed dataset it wrote is
  read back by trainer.data.indexed_dataset and compared with the tokenizer's own encoding of
  each document; the log is under RUN_DIR/aux/preprocess-<id>/, the events in events.jsonl. A
  second job on a malformed file fails: exit 1, an `aux_failed` event that quotes the error.
- With --local (submitit's LocalExecutor): `runctl eval` of a checkpoint of a real 2-step run
  gives the loss the trainer's own in-run evaluation logged at that step (DeepSpeed's pipeline
  engine vs the aux job's plain BloomModel), and `runctl export-hf` writes a directory that
  transformers loads, whose every weight, rounded to bf16, is the one DeepSpeed saved in the
  checkpoint's own layer files, and whose loss on the same validation samples is that loss too
  (transformers' BLOOM, fp32, vs the trainer's bf16 evaluation; a loose check: after 2 steps every
  model is near the uniform loss). A missing checkpoint fails with exit 1.
"""

from __future__ import annotations

import getpass
import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.cli.main import main
from orchestrator.contract import RunPaths, read_jsonl
from orchestrator.errors import EXIT_FAILURE
from orchestrator.plan.config import parse_config
from orchestrator.plan.config.load import resolve_paths

AUX_PARTITION = "auxtest"  # made by the fixture beside the cluster's default partition "debug"
REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "data" / "tokenizer.json"
DOCS = ["Le chat dort sur le canapé.", "The quick brown fox jumps over the lazy dog.", "",
        "Un deux trois quatre cinq six sept huit neuf dix.", "print('hello world')", "Kwa heri, rafiki."]


def _events(run_dir: Path, job_id: str) -> list[dict]:
    return [e for e in read_jsonl(RunPaths.of(run_dir).events) if e.get("job_id") == job_id]


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def slurm_on_path(local_cluster, monkeypatch):
    """sbatch/squeue/srun of the test cluster for this process (submitit calls them plainly)."""
    for name, value in local_cluster.slurm_env().items():
        monkeypatch.setenv(name, value)
    return local_cluster


@pytest.fixture
def aux_partition(slurm_on_path):
    """A second partition beside the default "debug": a job that lands there was sent there.
    Removed afterwards (SLURM refuses while a job of it is still completing: retried)."""
    made = subprocess.run(["scontrol", "create", f"PartitionName={AUX_PARTITION}", "Nodes=ALL", "Default=NO",
                           "MaxTime=INFINITE", "State=UP"], capture_output=True, text=True)
    shown = subprocess.run(["scontrol", "show", "partition", AUX_PARTITION], capture_output=True, text=True)
    assert made.returncode == 0 or shown.returncode == 0, made.stderr
    yield AUX_PARTITION
    for _ in range(20):
        if subprocess.run(["scontrol", "delete", f"PartitionName={AUX_PARTITION}"], capture_output=True).returncode == 0:
            break
        time.sleep(0.5)


@pytest.mark.slurm
def test_preprocess_runs_as_a_slurm_job_on_the_runs_partition_and_account(aux_partition, tmp_path, capsys):
    from tokenizers import Tokenizer

    from orchestrator.operate.runs import prepare_run_dir
    from trainer.data.indexed_dataset import MMapIndexedDataset

    data = yaml.safe_load((REPO / "configs" / "demo-cpu-4node.yaml").read_text())
    data["cluster"].update(python=sys.executable, partition=AUX_PARTITION, account="bloom-aux", cpus_per_task=1)
    canary = tmp_path / "injected"  # cluster.env reaches submitit's script as `export` lines
    data["cluster"]["env"]["AUX_CANARY"] = f"$(touch {canary}); `touch {canary}`'; touch {canary}; '"
    data["notifications"] = {}
    cfg = resolve_paths(parse_config(data, source="aux-test"), REPO / "configs")
    run_dir = prepare_run_dir(cfg, tmp_path / "run").root
    good = tmp_path / "docs.jsonl.gz"
    with gzip.open(good, "wt", encoding="utf-8") as handle:
        handle.writelines(json.dumps({"text": t}) + "\n" for t in DOCS)

    code, out, err = _run(capsys, "preprocess", str(run_dir), "--input", str(good), "--output-prefix",
                          str(tmp_path / "out" / "docs"), "--tokenizer", str(TOKENIZER), "--json")
    assert code == 0, out + err
    outcome = json.loads(out)
    job_id = outcome["job_id"]
    job_dir = run_dir / "aux" / f"preprocess-{job_id}"
    assert Path(outcome["log"]).parent == job_dir and Path(outcome["log"]).is_file()
    # SLURM's own record of the job: the run's partition and account, the aux job's name.
    shown = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    assert f"Partition={AUX_PARTITION}" in shown and "Account=bloom-aux" in shown, shown
    assert f"JobName={cfg.name}-preprocess" in shown, shown
    assert not canary.exists(), "a cluster.env value ran as shell in the aux job's script"

    # The dataset, read back by the trainer's reader, against the tokenizer itself.
    tokenizer = Tokenizer.from_file(str(TOKENIZER))
    eod = tokenizer.token_to_id("</s>")
    expected = [tokenizer.encode(t, add_special_tokens=False).ids + [eod] for t in DOCS if t]
    dataset = MMapIndexedDataset(tmp_path / "out" / "docs")
    assert len(dataset) == len(expected) == 5 and len(dataset.doc_idx) - 1 == 5  # Megatron: doc_idx has docs + 1
    assert [list(map(int, dataset[i])) for i in range(len(dataset))] == expected

    submitted, finished = _events(run_dir, job_id)
    assert (submitted["event"], finished["event"]) == ("aux_submitted", "aux_finished")
    assert submitted["user"] == finished["user"] == getpass.getuser() and submitted["where"] == "slurm"
    assert finished["result"]["documents"] == 5 and finished["state"] == "completed"

    # A job that fails inside: exit 1, the failure recorded with the error, no dataset written.
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": broken\n')
    code, out, err = _run(capsys, "preprocess", str(run_dir), "--input", str(bad), "--output-prefix",
                          str(tmp_path / "out" / "bad"), "--tokenizer", str(TOKENIZER))
    assert code == EXIT_FAILURE, out + err
    failed = read_jsonl(RunPaths.of(run_dir).events)[-1]
    assert failed["event"] == "aux_failed" and failed["kind"] == "preprocess", failed
    assert "bad.jsonl:2: not valid JSON" in failed["error"] and "not valid JSON" in err, failed
    assert Path(failed["log"]).parent == run_dir / "aux" / f"preprocess-{failed['job_id']}"
    assert not (tmp_path / "out" / "bad.idx").exists()


@pytest.mark.slurm
def test_a_job_that_dies_without_a_result_is_reported_failed(slurm_on_path, tmp_path, capsys, monkeypatch):
    """No accounting on the local cluster (as on many sites' login nodes without sacct rights):
    submitit's own watcher would wait forever for a job that never wrote its result. The end
    comes from squeue: an interpreter that does not exist on the node fails the job at once."""
    import orchestrator.operate.auxjobs
    from orchestrator.operate.runs import prepare_run_dir

    monkeypatch.setattr(orchestrator.operate.auxjobs, "RESULT_GRACE_SECONDS", 2.0)
    data = yaml.safe_load((REPO / "configs" / "demo-cpu-4node.yaml").read_text())
    data["cluster"].update(python="/nonexistent/bin/python3", cpus_per_task=1)
    data["notifications"] = {}
    run_dir = prepare_run_dir(parse_config(data, source="aux-test"), tmp_path / "run").root
    code, out, err = _run(capsys, "eval", str(run_dir), "--step", "1")
    assert code == EXIT_FAILURE, out + err
    failed = read_jsonl(RunPaths.of(run_dir).events)[-1]
    assert failed["event"] == "aux_failed" and "without a result" in failed["error"], failed
    assert "/nonexistent/bin/python3" in failed["error"], failed  # srun's complaint, from the job's log


@pytest.mark.slow  # ~40 s on 2 cores: a 2-step training run, then three aux jobs
def test_eval_and_export_hf_locally_match_the_trainers_own_evaluation(tmp_path, capsys):
    import torch
    from transformers import BloomForCausalLM

    from tests.trainer import launch_local
    from tests.trainer.runs import make_run_dir
    from trainer.data import build_data_loader
    from trainer.loop import build_datasets, pipe_batches

    run_dir = make_run_dir(tmp_path / "run", cluster={"python": sys.executable},
                           checkpoint={"interval_steps": 2}, data={"eval_interval": 2, "eval_iters": 1})
    env = {"TRAINER_MAX_STEPS": "2", "TRAINER_TENSORBOARD": "0", "OMP_NUM_THREADS": "1"}
    assert launch_local.run(run_dir, 1, env, timeout=300) == [0], launch_local.read_log(run_dir)
    trainer_eval = next(r["eval_loss"] for r in read_jsonl(RunPaths.of(run_dir).metrics) if r["step"] == 2)

    code, out, err = _run(capsys, "eval", str(run_dir), "--step", "2", "--local", "--json")
    assert code == 0, out + err
    outcome = json.loads(out)
    loss = outcome["result"]["loss"]
    with capsys.disabled():
        print(f"\neval job loss {loss:.6f} vs the trainer's eval_loss {trainer_eval:.6f}: |diff| {abs(loss - trainer_eval):.2e}")
    assert abs(loss - trainer_eval) <= 1e-4, (loss, trainer_eval)  # same weights, samples, dtype and kernels
    finished = _events(run_dir, outcome["job_id"])[-1]
    assert finished["event"] == "aux_finished" and finished["where"] == "local" and finished["result"]["loss"] == loss
    assert (run_dir / "aux" / f"eval-{outcome['job_id']}" / f"{outcome['job_id']}_0_log.out").is_file()

    code, out, err = _run(capsys, "export-hf", str(run_dir), "--local", "--out", str(tmp_path / "hf"), "--json")
    assert code == 0, out + err
    model = BloomForCausalLM.from_pretrained(tmp_path / "hf").eval()
    cfg = parse_config(yaml.safe_load((run_dir / "run.yaml").read_text()), source="test")
    assert model.config.n_layer == cfg.model.num_layers and model.config.hidden_size == cfg.model.hidden_size
    # Every weight, against the bf16 module DeepSpeed saved (the export goes through the universal
    # checkpoint's fp32 masters: rounded to bf16 they are those weights). DeepSpeed's layer files:
    # layer_00 the embedding (+LN), layer_01..L the blocks, layer_L+1 the final LayerNorm.
    layers = cfg.model.num_layers
    exported = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    saved = {}
    for path in sorted((run_dir / "checkpoints" / "step_0000002").glob("layer_*-model_00-model_states.pt")):
        unit = int(path.name[len("layer_"):].split("-")[0])
        prefix = "transformer." if unit == 0 else ("transformer.ln_f." if unit == layers + 1 else f"transformer.h.{unit - 1}.")
        saved.update({prefix + k: v for k, v in torch.load(path, weights_only=True).items()})
    assert saved.keys() == exported.keys(), set(saved) ^ set(exported)
    worst = max(float((exported[k].to(torch.bfloat16).float() - saved[k].float()).abs().max()) for k in saved)
    with capsys.disabled():
        print(f"export vs DeepSpeed's saved bf16 weights: {len(saved)} tensors, max abs error {worst:.2e}")
    assert worst == 0.0
    _, valid = build_datasets(cfg, RunPaths.of(run_dir), rank=0)  # the samples the trainer evaluated on
    input_ids, labels = next(pipe_batches(build_data_loader(valid, 0, cfg.parallel.global_batch_size, 0, 1)))
    with torch.no_grad():
        logits = model(input_ids).logits.float()
    hf_loss = float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)))
    with capsys.disabled():
        print(f"transformers loss of the export {hf_loss:.6f} vs the trainer's bf16 eval_loss {trainer_eval:.6f}: "
              f"|diff| {abs(hf_loss - trainer_eval):.2e}")
    assert abs(hf_loss - trainer_eval) <= 2e-2

    code, out, err = _run(capsys, "eval", str(run_dir), "--step", "99", "--local")
    assert code == EXIT_FAILURE and "no checkpoint" in err, out + err
    assert read_jsonl(RunPaths.of(run_dir).events)[-1]["event"] == "aux_failed"


def test_only_the_runs_owner_may_run_aux_jobs(tmp_path, capsys, monkeypatch):
    """Another user (an operator of the run, say) is refused before anything is submitted or
    written: the job would run as them and write into the owner's run directory and events."""
    from orchestrator.errors import EXIT_PERMISSION
    from orchestrator.operate.runs import prepare_run_dir

    data = yaml.safe_load((REPO / "configs" / "demo-cpu-4node.yaml").read_text())
    data["notifications"] = {}
    run_dir = prepare_run_dir(parse_config(data, source="aux-test"), tmp_path / "run").root
    monkeypatch.setattr("os.geteuid", lambda: run_dir.stat().st_uid + 4242)
    code, out, err = _run(capsys, "eval", str(run_dir), "--local")
    assert code == EXIT_PERMISSION and "only the owner" in err, out + err
    assert read_jsonl(RunPaths.of(run_dir).events) == [] and not (run_dir / "aux").exists()
