"""The baseline a user would pick for the same training step: transformers' BloomForCausalLM with
torch.optim.AdamW, as the Trainer runs it with `bf16=True` (fp32 weights and optimizer state, bf16
autocast for the forward and backward, gradient accumulation, clipping at 1.0, fused AdamW on CUDA,
the library's default attention, which for BLOOM is its baddbmm + softmax recipe).

Used by bench/train_step_gpu.py, which times it beside our step at the same batch in the same run.
"""

from __future__ import annotations

import contextlib
import statistics
import time


def run_transformers_baseline(layers: int, hidden: int, heads: int, vocab: int, seq: int, micro_batch: int,
                              grad_accum: int, steps: int, warmup: int, gpu: bool, batches) -> dict:
    """Median step time and losses of `steps` timed steps (after `warmup`) of HF BLOOM + AdamW.
    `batches` yields (input_ids, labels) [micro_batch, seq], already shifted by one."""
    import torch
    import transformers
    from transformers import BloomConfig, BloomForCausalLM

    device = torch.device("cuda" if gpu else "cpu")
    config = BloomConfig(vocab_size=vocab, hidden_size=hidden, n_layer=layers, n_head=heads,
                         hidden_dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(1)
    with device:  # initialise on the device: a CPU init of 1.7B parameters takes minutes
        model = BloomForCausalLM(config)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=gpu)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if gpu else contextlib.nullcontext()
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    loss_fn = torch.nn.CrossEntropyLoss()
    times, losses = [], []
    for index in range(warmup + steps):
        sync()
        started = time.perf_counter()
        total = 0.0
        for _ in range(grad_accum):
            input_ids, labels = (t.to(device) for t in next(batches))
            with autocast:
                logits = model(input_ids=input_ids).logits  # [b, s, V]
            # the labels are already shifted (next tokens), as in our step: plain cross entropy in fp32
            loss = loss_fn(logits.float().view(-1, vocab), labels.view(-1)) / grad_accum
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(total))  # one host sync per step, as ours
        sync()
        if index >= warmup:
            times.append(time.perf_counter() - started)
    record = {"what": "transformers BloomForCausalLM + torch.optim.AdamW (fp32 weights, bf16 autocast on CUDA, "
                      "fused AdamW on CUDA, grad accumulation, clip 1.0, eager attention)",
              "transformers": transformers.__version__,
              "parameters": sum(p.numel() for p in model.parameters()),
              "step_seconds_median": statistics.median(times), "step_seconds_all": times, "losses": losses,
              "max_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if gpu else None}
    del model, optimizer
    if gpu:
        torch.cuda.empty_cache()
    return record
