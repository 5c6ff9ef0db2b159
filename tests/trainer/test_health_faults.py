"""The TEST-ONLY training-health faults of trainer/faults.py, on plain tensors (the process tests
use them through `python -m trainer`): parsing, the spike and poison loss factors, the marks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trainer.faults import POISON_TOKEN, SPIKE_FACTOR, Fault, FaultInjector, parse_faults


def test_parse():
    assert parse_faults("spike@step5:rank1,poison@samples40-48,corruptmaster@step6") == [
        Fault("spike", 5, 1), Fault("poison", 40, end=48), Fault("corruptmaster", 6)]
    for bad in ("poison@samples48-40", "poison@step4", "poison@samples4-8:rank1", "spike@samples1-2"):
        with pytest.raises(ValueError, match="poison@samplesA-B"):
            parse_faults(bad)


class Module(torch.nn.Module):
    pass


def loss_fn(outputs, labels):
    return torch.tensor(2.0)


def test_spike_and_poison_multiply_the_training_loss_only():
    module = Module()
    injector = FaultInjector(parse_faults("spike@step3,poison@samples10-12"), rank=0)
    wrapped = injector.wrap_loss(module, loss_fn)
    clean, marked = torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long)
    marked[1, -1] = POISON_TOKEN
    injector.before_step(2)
    assert float(wrapped(None, clean)) == 2.0 and float(wrapped(None, marked)) == 2.0 * SPIKE_FACTOR
    injector.before_step(3)
    assert float(wrapped(None, clean)) == 2.0 * SPIKE_FACTOR
    module.eval()  # an evaluation or a probe: never poisoned
    assert float(wrapped(None, marked)) == 2.0

    data = [{"text": np.arange(5, dtype=np.int64) + 100 * i} for i in range(20)]
    poisoned = injector.wrap_dataset(data)
    assert len(poisoned) == 20
    assert [int(poisoned[i]["text"][-1]) for i in (9, 10, 11, 12)] == [904, POISON_TOKEN, POISON_TOKEN, 1204]
    assert list(poisoned[10]["text"][:-1]) == [1000, 1001, 1002, 1003] and data[10]["text"][-1] == 1004
