#!/usr/bin/env python3
"""How many logits-sized fp32 tensors libtorch's CPU cross-entropy holds at once, forward and
backward: the growth of this process's peak RSS (VmHWM) in units of one (N, V) fp32 tensor.
bench/src/mem_split.rs's TORCH_CE_LOGITS_COPIES comes from it (2.0 after the forward, 3.0 after
the backward with torch 2.11 on the CPU).

    .venv/bin/python scripts/torch-ce-memory.py
"""
import torch


def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


torch.set_num_threads(1)
N, C, V = 4096, 32, 25000
h = torch.randn(N, C, requires_grad=True)
w = torch.randn(V, C, requires_grad=True)
labels = torch.randint(0, V, (N,))
# The kernels' first call allocates on its own: warm them up small.
torch.nn.functional.cross_entropy(torch.randn(8, 16, requires_grad=True), torch.randint(0, 16, (8,))).backward()
one = N * V * 4
base = status("VmHWM")


def loss_of():
    logits = h @ w.t()  # dropped on return, as the models' loss functions drop theirs
    return torch.nn.functional.cross_entropy(logits.float(), labels)


loss = loss_of()
print(f"forward:  peak grew by {(status('VmHWM') - base) / one:.2f} x the logits ({one / 2**20:.0f} MiB)")
loss.backward()
print(f"backward: peak grew by {(status('VmHWM') - base) / one:.2f} x the logits")
